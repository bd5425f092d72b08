//! Model check of [`ConnTable`] against a naive reference.
//!
//! The reference keeps every connection ever opened in a `Vec` (with an `open` flag) and the
//! connect backoff of each endpoint in another `Vec`, and recomputes every answer by scanning
//! them: the live connection of an endpoint, idle deadlines from the last activity, the
//! earliest deadline, which connections a timeout closes. It shares no code with the table;
//! it only uses the public backoff API (its own `Backoff` per endpoint, fed by its own copy
//! of the random stream) so it knows which delay a failed connect must produce.
//!
//! Invariants checked after every operation: never two live connections for one endpoint;
//! removal only by the live id (stale closes change nothing); ids are fresh; every answer,
//! every `Close` action, `poll_timeout` and the per-endpoint backoff agree with the
//! reference. At the end every uid is disconnected and time jumps to the end: every
//! connection ever opened must have been closed exactly once and the table must be empty.
//!
//! The table's uids and hosts are [`user::Key`]s. Operations 33, 34 and 35 each arm one `Hash`,
//! `Eq` or `Clone` call (in that order) to panic and run another operation under `catch_unwind`
//! (see [`super::user`]): if the armed call fired, the table must be exactly as before and the
//! reference is rolled back.
//!
//! Events are on for inputs whose last byte is odd. After each operation its events are
//! drained and must be exactly what the operation did by the reference: one `Opened` per
//! `Route::Open`, one `Connected` per accepted connect, one `Closed` per connection forgotten
//! with the reference's cause (`Idle` or `ConnectTimedOut` by whether it was still connecting,
//! `Disconnected`, `ConnectFailed`, `Reported`, `Shutdown` for `close_all`), those that
//! queued a `Close` in the order of
//! the actions; nothing else, nothing dropped, and nothing at all with events off.

use alloc::format;
use alloc::vec::Vec;
use core::time::Duration;

use super::user::{self, Arm};
use super::{Cursor, Divergence};
// The fixed FNV-1a hasher the tests and checkers share (no `std` needed).
use crate::backoff::Jitter;
use crate::backoff::{Backoff, BackoffConfig};
use crate::conn_key::{
    BackoffFrom, CloseCause, ConnAction, ConnConfig, ConnEvent, ConnId, ConnKey, ConnState,
    ConnTable, ConnectAttempt, Disconnected, FinishError, Route,
};
use crate::rng::SplitMix64;
use crate::test_hasher::TestHasher as Fnv;
use crate::time::Instant;

type Key = ConnKey<u8, u8>;
/// The table's endpoint: uid and host are user keys.
type UserKey = ConnKey<user::Key, user::Key>;
type Table = ConnTable<user::Key, user::Key, Fnv>;

/// Operations before the panicking-callback ones (33 `Hash`, 34 `Eq`, 35 `Clone`).
const OPS: u8 = 33;

/// The table's form of a reference endpoint.
fn to_table(k: &Key) -> UserKey {
    ConnKey::new(user::Key::new(k.uid), user::Key::new(k.host), k.port)
}

/// The reference's form of a table endpoint (reads ids: runs no key callback).
fn to_ref(k: &UserKey) -> Key {
    ConnKey::new(k.uid.id(), k.host.id(), k.port)
}

fn route_to_ref(r: &Route<user::Key, user::Key>) -> Route<u8, u8> {
    match r {
        Route::Use(id) => Route::Use(*id),
        Route::Open(id, k, a) => Route::Open(*id, to_ref(k), *a),
        Route::Wait { until } => Route::Wait { until: *until },
        Route::Exhausted => Route::Exhausted,
    }
}

const UIDS: u8 = 3;
const HOSTS: u8 = 3;
const PORTS: [u16; 2] = [0, u16::MAX];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Connecting,
    Connected,
}

#[derive(Clone, Debug)]
struct RefConn {
    id: ConnId,
    key: Key,
    stage: Stage,
    in_flight: u64,
    last_activity: Instant,
    open: bool,
    /// How many times something closed it (must end at exactly 1).
    closes: u32,
    /// When its connect attempt started, the backoff drawn for it then, and the endpoint's
    /// sequence after that draw (committed only by a failed connect).
    started: Instant,
    delay: Duration,
    drawn: Backoff,
}

#[derive(Clone, Debug)]
struct RefBackoff {
    key: Key,
    backoff: Backoff,
    until: Instant,
    /// When the endpoint's last connection went away.
    lost_at: Instant,
}

#[derive(Clone, Debug)]
struct Reference {
    now: Instant,
    max_idle: Duration,
    min_connect_timeout: Duration,
    from: BackoffFrom,
    cfg: BackoffConfig,
    rng: SplitMix64,
    conns: Vec<RefConn>,
    backoffs: Vec<RefBackoff>,
}

impl Reference {
    fn observe(&mut self, now: Instant) -> Instant {
        if now > self.now {
            self.now = now;
        }
        self.now
    }

    fn live(&self, key: &Key) -> Option<&RefConn> {
        self.conns.iter().find(|c| c.open && c.key == *key)
    }

    fn open_conn(&mut self, id: ConnId) -> Option<&mut RefConn> {
        self.conns.iter_mut().find(|c| c.open && c.id == id)
    }

    fn backoff(&self, key: &Key) -> Option<&RefBackoff> {
        self.backoffs.iter().find(|b| b.key == *key)
    }

    fn close(&mut self, id: ConnId) {
        let now = self.now;
        let mut key = None;
        for c in self.conns.iter_mut().filter(|c| c.open && c.id == id) {
            c.open = false;
            c.closes = c.closes.saturating_add(1);
            key = Some(c.key);
        }
        if let Some(k) = key {
            for b in self.backoffs.iter_mut().filter(|b| b.key == k) {
                b.lost_at = now;
            }
        }
    }

    /// When an open connection with nothing in flight is closed: `max_idle` after its last
    /// activity, and a connecting one not before its attempt's connect deadline.
    fn idle_deadline(&self, c: &RefConn) -> Option<Instant> {
        (c.open && c.in_flight == 0).then(|| {
            let idle = c.last_activity + self.max_idle;
            if c.stage == Stage::Connecting {
                idle.max(self.attempt_of(c.started, c.delay).deadline())
            } else {
                idle
            }
        })
    }

    fn forget_deadline(&self, b: &RefBackoff) -> Option<Instant> {
        let has_conn = self.live(&b.key).is_some();
        (!has_conn).then(|| b.until.max(b.lost_at) + self.max_idle)
    }

    fn earliest(&self) -> Option<Instant> {
        let idle = self.conns.iter().filter_map(|c| self.idle_deadline(c));
        let forget = self.backoffs.iter().filter_map(|b| self.forget_deadline(b));
        idle.chain(forget).min()
    }

    /// What `route` must answer, with `None` for "Open with a fresh id".
    fn handle_request(&mut self, now: Instant, key: &Key) -> Option<Route<u8, u8>> {
        let now = self.observe(now);
        if let Some(c) = self.conns.iter_mut().find(|c| c.open && c.key == *key) {
            c.last_activity = now;
            return Some(Route::Use(c.id));
        }
        match self.backoff(key) {
            Some(b) if now < b.until => Some(Route::Wait { until: b.until }),
            _ => None,
        }
    }

    /// A route opened `id`: draws its attempt's backoff from the endpoint's sequence (a
    /// fresh one if it has none) and returns the attempt the route must carry.
    fn opened(&mut self, id: ConnId, key: Key) -> ConnectAttempt {
        let mut drawn = self
            .backoff(&key)
            .map_or_else(Backoff::new, |b| b.backoff.clone());
        let attempt = drawn.attempt();
        let delay = match drawn.next_delay(&self.cfg, &mut self.rng) {
            Some(d) => d,
            None => self.cfg.delay_for(attempt, &mut self.rng),
        };
        self.conns.push(RefConn {
            id,
            key,
            stage: Stage::Connecting,
            in_flight: 0,
            last_activity: self.now,
            open: true,
            closes: 0,
            started: self.now,
            delay,
            drawn,
        });
        self.attempt_of(self.now, delay)
    }

    fn attempt_of(&self, started: Instant, delay: Duration) -> ConnectAttempt {
        let timeout = if delay > self.min_connect_timeout {
            delay
        } else {
            self.min_connect_timeout
        };
        ConnectAttempt::new(started, timeout)
    }

    fn connected(&mut self, now: Instant, id: ConnId) -> bool {
        let now = self.observe(now);
        let Some(c) = self.open_conn(id) else {
            return false;
        };
        if c.stage != Stage::Connecting {
            return false;
        }
        c.stage = Stage::Connected;
        c.last_activity = now;
        let key = c.key;
        self.backoffs.retain(|b| b.key != key);
        true
    }

    fn connect_failed(&mut self, now: Instant, id: ConnId) -> Option<Instant> {
        let now = self.observe(now);
        let c = self.open_conn(id)?;
        if c.stage != Stage::Connecting {
            return None;
        }
        let (key, started, delay, drawn) = (c.key, c.started, c.delay, c.drawn.clone());
        self.close(id);
        if self.backoff(&key).is_none() {
            self.backoffs.push(RefBackoff {
                key,
                backoff: Backoff::new(),
                until: Instant::ZERO,
                lost_at: now,
            });
        }
        let from = self.from;
        let b = self.backoffs.iter_mut().find(|b| b.key == key)?;
        b.backoff = drawn;
        b.until = match from {
            BackoffFrom::AttemptStart => started + delay,
            _ => now + delay,
        };
        b.lost_at = now;
        Some(b.until)
    }

    fn send(&mut self, now: Instant, id: ConnId) -> Result<(), Disconnected> {
        let _ = self.observe(now);
        match self.open_conn(id) {
            Some(c) => {
                c.in_flight = c.in_flight.saturating_add(1);
                Ok(())
            }
            None => Err(Disconnected { conn: id }),
        }
    }

    fn finish(&mut self, now: Instant, id: ConnId) -> Result<(), FinishError> {
        let now = self.observe(now);
        let c = self.open_conn(id).ok_or(FinishError::Disconnected(id))?;
        if c.in_flight == 0 {
            return Err(FinishError::NotInFlight(id));
        }
        c.in_flight -= 1;
        c.last_activity = now;
        Ok(())
    }

    fn closed(&mut self, now: Instant, id: ConnId) -> bool {
        let _ = self.observe(now);
        let found = self.open_conn(id).is_some();
        self.close(id);
        found
    }

    fn disconnect(&mut self, now: Instant, uid: u8) -> Vec<ConnId> {
        let _ = self.observe(now);
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|c| c.open && c.key.uid == uid)
            .map(|c| c.id)
            .collect();
        for id in &ids {
            self.close(*id);
        }
        ids
    }

    fn close_all(&mut self, now: Instant) -> Vec<ConnId> {
        let _ = self.observe(now);
        let ids: Vec<ConnId> = self.conns.iter().filter(|c| c.open).map(|c| c.id).collect();
        for id in &ids {
            self.close(*id);
        }
        ids
    }

    /// The connections a timeout at `now` closes, each with its cause.
    fn timeout(&mut self, now: Instant) -> Vec<(ConnId, CloseCause)> {
        let now = self.observe(now);
        let due: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|c| self.idle_deadline(c).is_some_and(|d| d <= now))
            .map(|c| c.id)
            .collect();
        let mut closed = Vec::new();
        for id in &due {
            // A connect still running at its deadline failed: its backoff counts.
            let connecting = self
                .conns
                .iter()
                .any(|c| c.open && c.id == *id && c.stage == Stage::Connecting);
            if connecting {
                let _ = self.connect_failed(now, *id);
                closed.push((*id, CloseCause::ConnectTimedOut));
            } else {
                self.close(*id);
                closed.push((*id, CloseCause::Idle));
            }
        }
        let forget: Vec<Key> = self
            .backoffs
            .iter()
            .filter(|b| self.forget_deadline(b).is_some_and(|d| d <= now))
            .map(|b| b.key)
            .collect();
        self.backoffs.retain(|b| !forget.contains(&b.key));
        closed
    }
}

/// An endpoint to route to: mostly the uid's current address (the fresh metadata), else
/// any address of the uid (stale metadata, or a port change).
fn decode_key(c: &mut Cursor<'_>, current: &[(u8, u16); UIDS as usize]) -> Key {
    let uid = c.below(UIDS);
    let b = c.u8();
    let (host, port) = match current.get(usize::from(uid)) {
        Some(&addr) if b < 176 => addr,
        _ => {
            let host = c.below(HOSTS);
            let port = PORTS.get(usize::from(c.below(2))).copied().unwrap_or(0);
            (host, port)
        }
    };
    ConnKey::new(uid, host, port)
}

fn all_keys() -> impl Iterator<Item = Key> {
    (0..UIDS).flat_map(|u| {
        (0..HOSTS).flat_map(move |h| PORTS.into_iter().map(move |p| ConnKey::new(u, h, p)))
    })
}

/// The next `now`: mostly small steps forward, sometimes back, past `max_idle`, or to the
/// end of time (rarely, since nothing new happens once the clock sits at `Instant::MAX`).
fn step_time(c: &mut Cursor<'_>, now: Instant) -> Instant {
    match c.u8() {
        0..=99 => now + Duration::from_millis(u64::from(c.u16() % 1_000)),
        100..=159 => now + Duration::from_micros(u64::from(c.u16())),
        160..=189 => now - Duration::from_millis(u64::from(c.u16() % 5_000)),
        190..=219 => now + Duration::from_millis(u64::from(c.u32() % 1_500_000)),
        220..=249 => now + Duration::from_nanos(u64::from(c.u8())),
        250..=253 => c.time_step(now),
        _ => Instant::MAX - Duration::from_nanos(u64::from(c.u8())),
    }
}

/// An id for an operation: often a live one, else any issued before (mostly stale), or bogus.
fn pick_id(c: &mut Cursor<'_>, ids: &[ConnId], r: &Reference) -> ConnId {
    let b = c.u8();
    if b & 1 == 0 {
        let live: Vec<ConnId> = r.conns.iter().filter(|c| c.open).map(|c| c.id).collect();
        if let Some(id) = live.get(usize::from(b >> 1) % live.len().max(1)) {
            return *id;
        }
    }
    if b % 8 == 1 || ids.is_empty() {
        return match b % 3 {
            0 => ConnId::from_bits(u128::from(c.u64()) << 32 | u128::from(c.u8())),
            1 => ConnId::from_bits(0),
            _ => ConnId::from_bits(u128::MAX),
        };
    }
    let len = ids.len();
    let back = usize::from(b >> 3) % len.min(6);
    let idx = if b & 4 == 0 {
        len - 1 - back // a recent one
    } else {
        usize::from(c.u8()) % len
    };
    ids.get(idx).copied().unwrap_or(ConnId::from_bits(0))
}

fn decode_max_idle(c: &mut Cursor<'_>) -> Duration {
    match c.below(6) {
        0 => Duration::from_secs(600),
        1 => Duration::from_secs(2),
        2 => Duration::from_nanos(1),
        3 => Duration::MAX,
        4 => Duration::from_millis(500),
        _ => match c.duration() {
            d if d.is_zero() => Duration::from_nanos(1),
            d => d,
        },
    }
}

/// The table's `Close` actions, in the order it queued them.
fn drain(t: &mut Table) -> Vec<ConnId> {
    let mut out = Vec::new();
    while let Some(a) = t.poll_action() {
        match a {
            ConnAction::Close(id) => out.push(id),
        }
    }
    out
}

/// What an operation must have done: the connections it closed with a `Close` action (in
/// any order) and its events (in order, except that those of closes with an action follow
/// the actions' order, which the reference does not model).
#[derive(Default)]
struct Expect {
    closed: Vec<ConnId>,
    events: Vec<ConnEvent>,
}

impl Expect {
    fn event(event: ConnEvent) -> Self {
        Expect {
            closed: Vec::new(),
            events: alloc::vec![event],
        }
    }

    /// Closes with an action, each with its cause.
    fn closes(closed: impl IntoIterator<Item = (ConnId, CloseCause)>) -> Self {
        let mut e = Expect::default();
        for (conn, cause) in closed {
            e.closed.push(conn);
            e.events.push(ConnEvent::Closed { conn, cause });
        }
        e
    }
}

/// Whether a close of this cause queues a `Close` action.
fn closes_with_action(cause: CloseCause) -> bool {
    matches!(
        cause,
        CloseCause::Idle
            | CloseCause::ConnectTimedOut
            | CloseCause::Disconnected
            | CloseCause::Shutdown
    )
}

/// Drains the table's events after an operation whose actions were `actions` (in queue
/// order) and checks them against `want` (see [`Expect`]): with events off there must be
/// none, and none is ever dropped (the capacity is unbounded when on).
fn check_events(
    table: &mut Table,
    actions: &[ConnId],
    mut want: Vec<ConnEvent>,
    on: bool,
) -> Result<(), Divergence> {
    let got: Vec<ConnEvent> = core::iter::from_fn(|| table.poll_event()).collect();
    if !on {
        if !got.is_empty() {
            return Err(format!("events {got:?} with events off"));
        }
        return Ok(());
    }
    if table.events_dropped() != 0 {
        return Err(format!("{} events dropped", table.events_dropped()));
    }
    // A stable sort: only the closes with an action move, into the actions' order.
    want.sort_by_key(|e| match *e {
        ConnEvent::Closed { conn, cause } if closes_with_action(cause) => {
            actions.iter().position(|a| *a == conn)
        }
        _ => None,
    });
    if got != want {
        return Err(format!(
            "events {got:?}, want {want:?} (actions {actions:?})"
        ));
    }
    Ok(())
}

/// Decodes `data` into operations, drives the table and the reference, and reports the
/// first disagreement or broken invariant.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    let max_idle = decode_max_idle(&mut c);
    let seed = c.u64();
    // Events on for inputs ending in an odd byte (every event is then checked against the
    // reference); with them off, none may appear.
    let events = data.last().is_some_and(|b| b & 1 == 1);
    let mut st = fresh(ConnConfig::default().with_max_idle(max_idle), seed, events)?;
    let mut step = 0usize;

    while !c.is_empty() {
        step += 1;
        let Some(op) = c.select(CLOSE_ALL + 1) else {
            continue;
        };
        let done = if op == REBUILD {
            // Wind the table down (every connection closed exactly once), then go on with a
            // fresh one under a decoded config.
            let (cfg, seed) = decode_config(&mut c);
            let next = fresh(cfg, seed, events)?;
            wind_down(core::mem::replace(&mut st, next), step)?;
            continue;
        } else if op == CLOSE_ALL {
            apply(op, &mut c, &mut st, step)?
        } else if op >= OPS {
            // A panicking key callback during another operation.
            let Some(arm) = Arm::decode(&mut c, op - OPS, UIDS.max(HOSTS)) else {
                continue;
            };
            let Some(inner) = c.select(OPS) else {
                continue;
            };
            let before = user::snapshot(&st.table);
            let saved = (st.r.clone(), st.rng.clone(), st.ids.clone());
            match user::run(arm, || apply(inner, &mut c, &mut st, step)) {
                Ok(done) => done?,
                Err(user::Panicked) => {
                    user::unchanged(&before, &st.table, arm)
                        .map_err(|e| format!("step {step}: {e}"))?;
                    (st.r, st.rng, st.ids) = saved;
                    Some((
                        format!("{inner} with {arm:?} (panicked)"),
                        Expect::default(),
                    ))
                }
            }
        } else {
            apply(op, &mut c, &mut st, step)?
        };
        let Some((what, expect)) = done else {
            continue;
        };
        st.table
            .check_invariants()
            .map_err(|e| format!("step {step} ({what}): {e}"))?;
        compare(&mut st, expect, step, &what)?;
    }
    wind_down(st, step)
}

/// The selector value that replaces the table with a fresh one under a decoded config
/// (after the panicking-callback values `OPS..OPS + Arm::OPS`).
const REBUILD: u8 = OPS + Arm::OPS;

/// [`ConnTable::close_all`] (the client shuts down); the value after [`REBUILD`], so stored
/// inputs keep their meaning (`Cursor::select`).
const CLOSE_ALL: u8 = REBUILD + 1;

/// A config for [`REBUILD`], read in this order: `max_idle`, the rng seed, the backoff's
/// measure (`0` from the attempt's start, `1` from the failure), the minimum connect timeout
/// (`0` 20 s, `1` 1 ns, `2` `Duration::MAX`, `3` a decoded span), the connect backoff (`0`
/// the gRPC preset, `1` the gRPC numbers without jitter, `2` 1 ms → 50 ms ×2 without jitter,
/// so connects often outlast their backoff). An unassigned selector keeps the default.
fn decode_config(c: &mut Cursor<'_>) -> (ConnConfig, u64) {
    let max_idle = decode_max_idle(c);
    let seed = c.u64();
    let mut cfg = ConnConfig::default().with_max_idle(max_idle);
    if c.select(2) == Some(1) {
        cfg = cfg.with_backoff_from(BackoffFrom::Failure);
    }
    let min = match c.select(4) {
        Some(1) => Some(Duration::from_nanos(1)),
        Some(2) => Some(Duration::MAX),
        Some(3) => Some(c.duration().max(Duration::from_nanos(1))),
        _ => None,
    };
    if let Some(min) = min {
        cfg = cfg.with_min_connect_timeout(min);
    }
    let unjittered = |initial: Duration, max: Duration, num: u32, den: u32| {
        BackoffConfig::builder()
            .initial(initial)
            .max(max)
            .multiplier(num, den)
            .jitter(Jitter::None)
            .resolution(Duration::from_nanos(1))
            .build()
            .ok()
    };
    let backoff = match c.select(3) {
        Some(1) => unjittered(Duration::from_secs(1), Duration::from_secs(120), 16, 10),
        Some(2) => unjittered(Duration::from_millis(1), Duration::from_millis(50), 2, 1),
        _ => None,
    };
    if let Some(b) = backoff {
        cfg = cfg.with_connect_backoff(b);
    }
    (cfg, seed)
}

/// A fresh table and reference under `cfg`, both drawing from `seed`.
fn fresh(cfg: ConnConfig, seed: u64, events: bool) -> Result<State, Divergence> {
    let r = Reference {
        now: Instant::ZERO,
        max_idle: cfg.max_idle(),
        min_connect_timeout: cfg.min_connect_timeout(),
        from: cfg.backoff_from(),
        cfg: cfg.connect_backoff().clone(),
        rng: SplitMix64::new(seed),
        conns: Vec::new(),
        backoffs: Vec::new(),
    };
    let mut table: Table = ConnTable::new(cfg).map_err(|e| format!("valid config refused: {e}"))?;
    if events {
        table.set_event_capacity(usize::MAX);
    }
    Ok(State {
        table,
        events,
        rng: SplitMix64::new(seed),
        r,
        ids: Vec::new(),
        now: Instant::ZERO,
        // Each uid's address in the freshest metadata; a move op changes it.
        current: [(0u8, PORTS[0]); UIDS as usize],
    })
}

/// Closes everything: every connection ever opened must end closed exactly once, and the
/// table must end empty.
fn wind_down(mut st: State, step: usize) -> Result<(), Divergence> {
    let now = st.now;
    let mut expect = Expect::default();
    for uid in 0..UIDS {
        st.table.disconnect(now, &user::Key::new(uid));
        let closed = st.r.disconnect(now, uid);
        let e = Expect::closes(closed.into_iter().map(|id| (id, CloseCause::Disconnected)));
        expect.closed.extend(e.closed);
        expect.events.extend(e.events);
    }
    compare(&mut st, expect, step + 1, "disconnect all")?;
    st.table.handle_timeout(Instant::MAX);
    let closed = st.r.timeout(Instant::MAX);
    compare(
        &mut st,
        Expect::closes(closed),
        step + 2,
        "timeout at the end of time",
    )?;
    let State { table, r, .. } = st;
    if let Some(c) = r.conns.iter().find(|c| c.closes != 1) {
        return Err(format!("{:?} was closed {} times", c.id, c.closes));
    }
    if !table.is_empty() || table.tracked_endpoints() != 0 || table.poll_timeout().is_some() {
        return Err(format!(
            "table not empty at the end: {} live, {} endpoints, timeout {:?}",
            table.len(),
            table.tracked_endpoints(),
            table.poll_timeout()
        ));
    }
    Ok(())
}

/// What one run carries from operation to operation.
struct State {
    table: Table,
    /// Whether the table records events.
    events: bool,
    rng: SplitMix64,
    r: Reference,
    ids: Vec<ConnId>,
    now: Instant,
    current: [(u8, u16); UIDS as usize],
}

/// Runs operation `op` on the table and the reference: what it was and the closes it must
/// have asked for, or `None` when it was skipped.
fn apply(
    op: u8,
    c: &mut Cursor<'_>,
    st: &mut State,
    step: usize,
) -> Result<Option<(alloc::string::String, Expect)>, Divergence> {
    let State {
        table,
        rng,
        r,
        ids,
        now,
        current,
        ..
    } = st;
    let mut expect = Expect::default();
    let what = match op {
        0..=3 => {
            *now = step_time(c, *now);
            format!("time -> {now:?}")
        }
        4..=13 => {
            let key = decode_key(c, current);
            let got = table.handle_request(*now, &to_table(&key), rng);
            let want = r.handle_request(*now, &key);
            match (&got, want) {
                (Route::Open(id, k, attempt), None) => {
                    if to_ref(k) != key {
                        return Err(format!("step {step}: Open named {k:?} for {key:?}"));
                    }
                    if ids.contains(id) {
                        return Err(format!("step {step}: Open reused id {id:?}"));
                    }
                    let want = r.opened(*id, key);
                    if *attempt != want {
                        return Err(format!(
                            "step {step}: Open({id:?}) attempt {attempt:?}, reference {want:?}"
                        ));
                    }
                    ids.push(*id);
                    expect = Expect::event(ConnEvent::Opened { conn: *id });
                }
                (g, Some(w)) if route_to_ref(g) == w => {}
                (g, w) => {
                    return Err(format!(
                        "step {step}: route({key:?}) at {now:?}: table {g:?}, reference {w:?}"
                    ));
                }
            }
            format!("route {key:?} -> {got:?}")
        }
        14..=16 => {
            let id = pick_id(c, ids, r);
            let (g, w) = (table.handle_connected(*now, id), r.connected(*now, id));
            if g != w {
                return Err(format!("step {step}: connected({id:?}): {g} vs {w}"));
            }
            if w {
                expect = Expect::event(ConnEvent::Connected { conn: id });
            }
            format!("connected {id:?}")
        }
        17 | 18 => {
            let id = pick_id(c, ids, r);
            let g = table.handle_connect_failed(*now, id);
            let w = r.connect_failed(*now, id);
            if g != w {
                return Err(format!(
                    "step {step}: connect_failed({id:?}): {g:?} vs {w:?}"
                ));
            }
            if w.is_some() {
                expect = Expect::event(ConnEvent::Closed {
                    conn: id,
                    cause: CloseCause::ConnectFailed,
                });
            }
            format!("connect failed {id:?} -> {g:?}")
        }
        19..=22 => {
            let id = pick_id(c, ids, r);
            let (g, w) = (table.handle_send(*now, id), r.send(*now, id));
            if g != w {
                return Err(format!("step {step}: send({id:?}): {g:?} vs {w:?}"));
            }
            format!("send {id:?}")
        }
        23..=26 => {
            let id = pick_id(c, ids, r);
            let (g, w) = (table.handle_finished(*now, id), r.finish(*now, id));
            if g != w {
                return Err(format!("step {step}: finished({id:?}): {g:?} vs {w:?}"));
            }
            format!("finished {id:?}")
        }
        27 => {
            let id = pick_id(c, ids, r);
            let (g, w) = (table.handle_closed(*now, id), r.closed(*now, id));
            if g != w {
                return Err(format!("step {step}: closed({id:?}): {g} vs {w}"));
            }
            if w {
                expect = Expect::event(ConnEvent::Closed {
                    conn: id,
                    cause: CloseCause::Reported,
                });
            }
            format!("closed {id:?}")
        }
        32 => {
            // A live connection's id under another table's tag: unknown here. Every
            // handler must refuse it (the reference, which keys by the whole id, agrees),
            // so another table's id never closes or counts a connection of this one.
            let live: Vec<ConnId> = r.conns.iter().filter(|c| c.open).map(|c| c.id).collect();
            let Some(id) = live.get(usize::from(c.u8()) % live.len().max(1)).copied() else {
                return Ok(None);
            };
            let foreign = ConnId::from_bits(id.to_bits() ^ (1 << 96));
            // The reference sees the same calls (they may move its clock, as the table's).
            let got = (
                table.handle_closed(*now, foreign),
                table.handle_connected(*now, foreign),
                table.handle_send(*now, foreign),
                table.handle_finished(*now, foreign),
            );
            let want = (
                r.closed(*now, foreign),
                r.connected(*now, foreign),
                r.send(*now, foreign),
                r.finish(*now, foreign),
            );
            if got != want || got.0 || got.1 || got.2.is_ok() || got.3.is_ok() {
                return Err(format!(
                    "step {step}: another table's id {foreign:?}: {got:?} vs {want:?}"
                ));
            }
            if table.state(foreign).is_some() || table.state(id).is_none() {
                return Err(format!(
                    "step {step}: another table's id {foreign:?} was taken for {id:?}"
                ));
            }
            format!("foreign {foreign:?}")
        }
        28 => {
            let uid = c.below(UIDS + 1); // uid 3 is never routed
            let n = table.disconnect(*now, &user::Key::new(uid));
            let closed = r.disconnect(*now, uid);
            if n != closed.len() {
                return Err(format!(
                    "step {step}: disconnect({uid}) closed {n}, reference {}",
                    closed.len()
                ));
            }
            expect = Expect::closes(closed.into_iter().map(|id| (id, CloseCause::Disconnected)));
            format!("disconnect {uid}")
        }
        CLOSE_ALL => {
            // The client shuts down: every live connection closes, the table goes on.
            let n = table.close_all(*now);
            let closed = r.close_all(*now);
            if n != closed.len() {
                return Err(format!(
                    "step {step}: close_all closed {n}, reference {}",
                    closed.len()
                ));
            }
            expect = Expect::closes(closed.into_iter().map(|id| (id, CloseCause::Shutdown)));
            "close all".into()
        }
        29 => {
            if let Some(at) = table.poll_timeout() {
                *now = at;
            }
            table.handle_timeout(*now);
            expect = Expect::closes(r.timeout(*now));
            format!("timeout at poll_timeout {now:?}")
        }
        30 => {
            table.handle_timeout(*now);
            expect = Expect::closes(r.timeout(*now));
            format!("timeout {now:?}")
        }
        _ => {
            // A failover: the uid is announced at another address from now on.
            let uid = c.below(UIDS);
            let b = c.u8();
            let addr = (
                b % HOSTS,
                PORTS.get(usize::from(b >> 7)).copied().unwrap_or(0),
            );
            if let Some(slot) = current.get_mut(usize::from(uid)) {
                *slot = addr;
            }
            format!("uid {uid} moves to {addr:?}")
        }
    };
    Ok(Some((what, expect)))
}

fn compare(st: &mut State, expect: Expect, step: usize, what: &str) -> Result<(), Divergence> {
    let State {
        table,
        r,
        ids,
        events,
        ..
    } = st;
    // Only the table changes here (its actions and events are drained).
    let (table, r, ids) = (table, &*r, &ids[..]);
    let actions = drain(table);
    let mut closed = actions.clone();
    closed.sort();
    let mut expect_closed = expect.closed;
    expect_closed.sort();
    if closed != expect_closed {
        return Err(format!(
            "step {step} ({what}): closed {closed:?}, reference {expect_closed:?}"
        ));
    }
    check_events(table, &actions, expect.events, *events)
        .map_err(|e| format!("step {step} ({what}): {e}"))?;
    let (g, w) = (table.poll_timeout(), r.earliest());
    if g != w {
        return Err(format!(
            "step {step} ({what}): poll_timeout {g:?}, reference {w:?}"
        ));
    }
    let open = r.conns.iter().filter(|c| c.open).count();
    if table.len() != open {
        return Err(format!(
            "step {step} ({what}): {} live, reference {open}",
            table.len()
        ));
    }
    // Never two live connections for one endpoint, seen from the table's side.
    let mut live_keys: Vec<Key> = Vec::new();
    for id in ids {
        let Some(k) = table.key(*id).map(to_ref) else {
            continue;
        };
        if live_keys.contains(&k) {
            return Err(format!(
                "step {step} ({what}): two live connections for {k:?}"
            ));
        }
        live_keys.push(k);
    }
    for c in &r.conns {
        let want = c.open.then_some(match c.stage {
            Stage::Connecting => ConnState::Connecting,
            Stage::Connected => ConnState::Connected,
        });
        let (gs, gi) = (table.state(c.id), table.in_flight(c.id));
        let wi = c.open.then_some(c.in_flight);
        if gs != want || gi != wi {
            return Err(format!(
                "step {step} ({what}): {:?} is {gs:?}/{gi:?}, reference {want:?}/{wi:?}",
                c.id
            ));
        }
        let attempt =
            (c.open && c.stage == Stage::Connecting).then(|| r.attempt_of(c.started, c.delay));
        if table.connect_attempt(c.id) != attempt {
            return Err(format!(
                "step {step} ({what}): {:?}'s attempt {:?}, reference {attempt:?}",
                c.id,
                table.connect_attempt(c.id)
            ));
        }
        if c.open && table.key(c.id).map(to_ref) != Some(c.key) {
            return Err(format!("step {step} ({what}): {:?} lost its key", c.id));
        }
    }
    let mut tracked = 0;
    for key in all_keys() {
        let tk = to_table(&key);
        let live = r.live(&key).map(|c| c.id);
        let backoff = r.backoff(&key);
        if live.is_some() || backoff.is_some() {
            tracked += 1;
        }
        if table.connection(&tk) != live {
            return Err(format!(
                "step {step} ({what}): connection({key:?}) = {:?}, reference {live:?}",
                table.connection(&tk)
            ));
        }
        let attempts = backoff.map_or(0, |b| b.backoff.attempt());
        if table.connect_failures(&tk) != attempts {
            return Err(format!(
                "step {step} ({what}): connect_failures({key:?}) = {}, reference {attempts}",
                table.connect_failures(&tk)
            ));
        }
        let gate = backoff
            .filter(|b| live.is_none() && r.now < b.until)
            .map(|b| b.until);
        if table.backoff_until(r.now, &tk) != gate {
            return Err(format!(
                "step {step} ({what}): backoff_until({key:?}) = {:?}, reference {gate:?}",
                table.backoff_until(r.now, &tk)
            ));
        }
    }
    if table.tracked_endpoints() != tracked {
        return Err(format!(
            "step {step} ({what}): {} endpoints tracked, reference {tracked}",
            table.tracked_endpoints()
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
        assert_eq!(check(&[0]), Ok(()));
        assert_eq!(check(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), Ok(()));
    }

    #[test]
    fn scripted_failover_and_backoff_pass() {
        let data = [
            1, 0, 0, 0, 0, 0, 0, 0, 0, // max_idle = 2 s, seed 0
            4, 0, 0, // route uid 0 at its current address: Open
            17, 0, // its connect fails: backoff ~1 s
            4, 0, 0, // route again: Wait
            0, 0, 0xe7, 0x03, 0, 0, 0xe7, 0x03, // time +999 ms, twice
            4, 0, 0, // route: the gate is open, Open
            14, 0, // connected: backoff reset
            31, 0, 1, // failover: uid 0 moves to host 1
            4, 0, 0, // route: Open at the new address, the old one stays
            4, 0, 200, 0, 0, // stale metadata (host 0): Use the old connection
            19, 0,  // send on the old one
            30, // timeout now
            27, 19, // a late close of the failed first id: ignored
            29, // timeout at poll_timeout: the idle new connection closes
        ];
        assert_eq!(check(&data), Ok(()));
    }

    #[test]
    fn scripted_rebuild_with_jitter_free_grpc_numbers_passes() {
        let data = [
            1, 0, 0, 0, 0, 0, 0, 0, 0, // max_idle = 2 s, seed 0
            4, 0, 0,  // route: Open (table one)
            36, // wind down; a fresh table:
            0, 0, 0, 0, 0, 0, 0, 0, 0, // max_idle 10 min, seed 0
            0, 0, 1, // from the attempt's start, 20 s minimum, gRPC numbers without jitter
            4, 0, 0, // route: Open, backoff 1 s, timeout 20 s
            0, 0, 0x2c, 0x01, // time +300 ms
            17, 0, // its connect fails: gated until 1 s, not 1.3 s
            4, 0, 0, // route: Wait until 1 s
            0, 0, 0xbc, 0x02, // time +700 ms: at 1 s
            4, 0, 0,  // route: Open
            36, // wind down again; a fresh table:
            0, 0, 0, 0, 0, 0, 0, 0, 0, // max_idle 10 min, seed 0
            1, 1, 2, // from the failure, 1 ns minimum, 1 ms -> 50 ms x2
            4, 0, 0, // route: Open
            0, 0, 0x2c, 0x01, // time +300 ms
            17, 0, // fails: gated until 301 ms
            4, 0, 0, // route: Wait
        ];
        assert_eq!(check(&data), Ok(()));
    }
}
