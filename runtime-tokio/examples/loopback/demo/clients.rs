//! The two clients of every scenario.
//!
//! - naive: re-sends a rejected request at once, has no gate, dispatches every request as its
//!   own RPC with no bound on how many are in flight, keeps one connection per server uid at
//!   the address it first learned, and never refreshes metadata.
//! - ours: the core's machines driven by a small tokio loop: [`Batcher`] + dispatch window,
//!   [`WriteGate`] (disk backoff and KV pressure), [`ConnTable`] keyed by (uid, host, port),
//!   failover [`Call`] + [`RefreshCoalescer`].

use super::conn::{Conn, Disconnected};
use super::proto::{Request, Status};
use super::server::lock;
use runtime_tokio::TokioClock;
use runtime_tokio::failover::{
    AdminWriteGateway, Call, CallAction, CallConfig, CoalesceAction, ErrorClassifier, ErrorKind,
    RefreshCoalescer, Unlimited,
};
use runtime_tokio::rng::SplitMix64;
use runtime_tokio::{
    BatchAction, Batcher, BatcherConfig, ConnKey, ConnTable, GateState, Route, Signal,
    WindowConfig, WriteGate, WriteGateConfig,
};
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};
use tokio::sync::{mpsc, oneshot};

/// One operation: a write (`len` value bytes) or a read (`len` = 0) of id `id`.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    pub id: u64,
    pub shard: u32,
    pub len: u32,
    pub submitted: StdInstant,
}

/// What a client saw.
#[derive(Debug, Default)]
pub struct ClientStats {
    pub latencies: Vec<Duration>,
    /// Operations that ended in an error given to the user (outcome unknown for a write).
    pub failed: usize,
    /// Operations still unfinished at the deadline.
    pub abandoned: usize,
}

/// Upper bound on how often the naive client re-sends one operation.
const NAIVE_MAX_ATTEMPTS: u32 = 1_000_000;

/// A connection cached by server uid at the first address learned (never refreshed);
/// reconnects to that same address when it breaks.
#[derive(Clone, Debug)]
struct UidConn {
    addr: SocketAddr,
    conn: Arc<tokio::sync::Mutex<Option<Conn>>>,
}

impl UidConn {
    fn new(addr: SocketAddr) -> Self {
        UidConn {
            addr,
            conn: Arc::default(),
        }
    }
    async fn get(&self) -> Option<Conn> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Some(c.clone());
        }
        let c = Conn::connect(self.addr).await.ok()?;
        *slot = Some(c.clone());
        Some(c)
    }
}

fn request(write: bool, shard: u32, ops: &[Op]) -> Request {
    if write {
        let w: Vec<(u64, u32)> = ops.iter().map(|o| (o.id, o.len)).collect();
        Request::write(shard, &w)
    } else {
        let k: Vec<u64> = ops.iter().map(|o| o.id).collect();
        Request::read(shard, &k)
    }
}

/// The naive client for writes or reads: one task and one RPC per operation, re-sent at once
/// on any rejection or disconnect.
pub async fn naive_data(
    addr: SocketAddr,
    write: bool,
    mut ops: mpsc::UnboundedReceiver<Op>,
    deadline: StdInstant,
) -> ClientStats {
    let uid = UidConn::new(addr);
    let stats = Arc::new(Mutex::new(ClientStats::default()));
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(op) = ops.recv().await {
        let (uid, stats) = (uid.clone(), stats.clone());
        tasks.spawn(async move {
            for _ in 0..NAIVE_MAX_ATTEMPTS {
                if StdInstant::now() >= deadline {
                    break;
                }
                let Some(conn) = uid.get().await else {
                    tokio::task::yield_now().await;
                    continue;
                };
                if let Ok((Status::Ok, _)) = conn.call(request(write, op.shard, &[op])).await {
                    lock(&stats).latencies.push(op.submitted.elapsed());
                    return;
                }
            }
            lock(&stats).abandoned += 1;
        });
    }
    while tasks.join_next().await.is_some() {}
    std::mem::take(&mut *lock(&stats))
}

/// Our client for writes or reads: one driver task owning a [`Batcher`] (per-shard batches,
/// at most `max_in_flight` in flight per shard, batches grow while the window is exhausted)
/// and, for writes, a [`WriteGate`] (disk-write-locked backoff, KV pressure throttle).
/// Rejected operations wait in `held` until their bucket's gate opens, then re-join a batch.
pub async fn ours_data(
    addr: SocketAddr,
    write: bool,
    mut ops: mpsc::UnboundedReceiver<Op>,
    deadline: StdInstant,
    seed: u64,
) -> ClientStats {
    let mut stats = ClientStats::default();
    let Ok(conn) = Conn::connect(addr).await else {
        stats.abandoned = drain_count(&mut ops);
        return stats;
    };
    let clock = TokioClock::new();
    let cfg = if write {
        BatcherConfig::writes()
    } else {
        BatcherConfig::reads()
    }
    .with_window(WindowConfig::default());
    let Ok(mut batcher) = Batcher::<u32, Op, RandomState>::new(cfg) else {
        return stats;
    };
    let mut gate_cfg = WriteGateConfig::default();
    gate_cfg.kv_curve = runtime_tokio::ThrottleCurve::fluss_landed();
    let mut gate: WriteGate<u32, RandomState> = WriteGate::new(gate_cfg);
    let mut rng = SplitMix64::new(seed);
    // The attempt count of each operation (how often a batch holding it was rejected).
    let mut attempts: HashMap<u64, u32> = HashMap::new();
    let mut held: HashMap<u32, Vec<Op>> = HashMap::new();
    type Done = (
        u32,
        runtime_tokio::CreditId,
        Result<(Status, Vec<u8>), Disconnected>,
    );
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut input_open = true;
    let mut outstanding = 0usize;

    loop {
        let now = clock.now();
        // Held operations whose bucket opened re-join a batch.
        let opened: Vec<u32> = held
            .keys()
            .copied()
            .filter(|b| gate.check(now, b) == GateState::Open)
            .collect();
        for b in opened {
            for op in held.remove(&b).unwrap_or_default() {
                let bytes = u64::from(op.len) + 12;
                let _ = batcher.handle_op(now, b, op, bytes);
            }
        }
        // The input queue is empty: send what has credit, park the rest.
        batcher.flush(now);
        while let Some(action) = batcher.poll_action() {
            match action {
                BatchAction::Send { shard, credit } => {
                    let ops: Vec<Op> = batcher
                        .batch(credit)
                        .map(|b| b.ops().to_vec())
                        .unwrap_or_default();
                    if write && gate.check(now, &shard) != GateState::Open {
                        // Drain re-checks the gate (upstream's shouldSkipBucket): the batch
                        // goes back without an RPC; its operations come back as `Fail`.
                        let _ = batcher.handle_response(now, credit, core::iter::empty());
                        continue;
                    }
                    let (conn, tx) = (conn.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        let res = conn.call(request(write, shard, &ops)).await;
                        let _ = tx.send((shard, credit, res));
                    });
                }
                BatchAction::Deliver { handle, .. } => {
                    stats.latencies.push(handle.submitted.elapsed());
                    outstanding = outstanding.saturating_sub(1);
                }
                BatchAction::Fail { handle, .. } => {
                    // Only a rejected or skipped batch fails its operations: retry them when
                    // the bucket's gate opens.
                    held.entry(handle.shard).or_default().push(handle);
                }
                _ => {}
            }
        }
        if (!input_open && outstanding == 0) || StdInstant::now() >= deadline {
            break;
        }
        let wake = gate
            .poll_timeout()
            .map(|t| clock.sleep_until(t))
            .unwrap_or_else(|| clock.sleep_until(runtime_tokio::Instant::MAX));
        tokio::select! {
            op = ops.recv(), if input_open => match op {
                Some(op) => {
                    outstanding += 1;
                    let now = clock.now();
                    if gate.check(now, &op.shard) == GateState::Open {
                        let bytes = u64::from(op.len) + 12;
                        let _ = batcher.handle_op(now, op.shard, op, bytes);
                    } else {
                        held.entry(op.shard).or_default().push(op);
                    }
                    // Take everything already queued before flushing, so batches fill up.
                    while let Ok(op) = ops.try_recv() {
                        outstanding += 1;
                        if gate.check(now, &op.shard) == GateState::Open {
                            let bytes = u64::from(op.len) + 12;
                            let _ = batcher.handle_op(now, op.shard, op, bytes);
                        } else {
                            held.entry(op.shard).or_default().push(op);
                        }
                    }
                }
                None => input_open = false,
            },
            Some((shard, credit, res)) = done_rx.recv() => {
                let now = clock.now();
                match res {
                    Ok((Status::Ok, payload)) => {
                        let n = batcher.batch(credit).map_or(0, |b| b.len());
                        if write {
                            let ppm = payload
                                .get(..4)
                                .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                            gate.handle_success(now, &shard);
                            gate.handle_kv_signal(now, &shard, Signal::from_ppm(ppm));
                        }
                        let _ = batcher.handle_response(now, credit, 0..n);
                    }
                    Ok((Status::DiskWriteLocked, _)) => {
                        // The batch's attempt count before this retry (first rejection: 0).
                        let ids: Vec<u64> = batcher
                            .batch(credit)
                            .map(|b| b.ops().iter().map(|o| o.id).collect())
                            .unwrap_or_default();
                        let tries = ids.iter().map(|id| attempts.get(id).copied().unwrap_or(0));
                        let batch_attempts = tries.max().unwrap_or(0);
                        gate.handle_disk_write_locked(now, &shard, batch_attempts, &mut rng);
                        for id in ids {
                            *attempts.entry(id).or_default() += 1;
                        }
                        let _ = batcher.handle_response(now, credit, core::iter::empty());
                    }
                    Ok((Status::StorageBackpressure, _)) => {
                        gate.handle_kv_signal(now, &shard, Signal::Full);
                        let _ = batcher.handle_response(now, credit, core::iter::empty());
                    }
                    _ => {
                        // Disconnected or refused: retry after the retriable-write backoff.
                        gate.handle_retriable_write(now, &shard, 0, &mut rng);
                        let _ = batcher.handle_failure(now, credit);
                    }
                }
            },
            _ = wake => gate.handle_timeout(clock.now()),
        }
    }
    stats.abandoned = outstanding;
    stats
}

fn drain_count(ops: &mut mpsc::UnboundedReceiver<Op>) -> usize {
    let mut n = 0;
    while ops.try_recv().is_ok() {
        n += 1;
    }
    n
}

/// Admin writes: the naive client. `tasks` workers pull operations from `ops`; each is
/// re-sent at once on "not leader" or a broken connection, always to the coordinator uid's
/// first-learned address.
pub async fn naive_admin(
    first_leader: SocketAddr,
    tasks: usize,
    ops: mpsc::UnboundedReceiver<Op>,
    deadline: StdInstant,
) -> ClientStats {
    let uid = UidConn::new(first_leader);
    let ops = Arc::new(tokio::sync::Mutex::new(ops));
    let stats = Arc::new(Mutex::new(ClientStats::default()));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (uid, ops, stats) = (uid.clone(), ops.clone(), stats.clone());
        set.spawn(async move {
            loop {
                let Some(op) = ops.lock().await.recv().await else {
                    return;
                };
                let mut done = false;
                for _ in 0..NAIVE_MAX_ATTEMPTS {
                    if StdInstant::now() >= deadline {
                        break;
                    }
                    let Some(conn) = uid.get().await else {
                        tokio::task::yield_now().await;
                        continue;
                    };
                    let res = conn
                        .call_timeout(Request::admin(op.id), ADMIN_TIMEOUT)
                        .await;
                    if let Ok((Status::Ok, _)) = res {
                        done = true;
                        break;
                    }
                }
                let mut s = lock(&stats);
                if done {
                    s.latencies.push(op.submitted.elapsed());
                } else {
                    s.abandoned += 1;
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    std::mem::take(&mut *lock(&stats))
}

/// The connection table and the open connection behind each of its ids.
type Pool = (
    ConnTable<u32, IpAddr, RandomState>,
    HashMap<runtime_tokio::ConnId, Conn>,
);
/// The refresh coalescer and the joined callers it will release.
type Refresher = (
    RefreshCoalescer<usize>,
    HashMap<usize, oneshot::Sender<bool>>,
);

/// Shared state of our admin client: the leader's address, the connection table and its
/// open connections, and the refresh coalescer with the waiters it holds.
#[derive(Debug)]
struct Admin {
    coordinators: [SocketAddr; 2],
    leader: Mutex<SocketAddr>,
    table: Mutex<Pool>,
    refresh: Mutex<Refresher>,
    clock: TokioClock,
}

/// How long an admin write waits for its response before it counts as lost (both clients).
pub const ADMIN_TIMEOUT: Duration = Duration::from_millis(250);

/// The coordinators' server uid (both share it, as in Fluss: `cs-0`).
const COORDINATOR_UID: u32 = 0;

impl Admin {
    /// Sends one admin write on the connection for the current leader's endpoint.
    async fn send(&self, op: u64) -> Result<Status, Disconnected> {
        let addr = *lock(&self.leader);
        let key = ConnKey::new(COORDINATOR_UID, addr.ip(), addr.port());
        let mut conn = None;
        for _ in 0..1_000 {
            let route = lock(&self.table).0.route(self.clock.now(), &key);
            match route {
                Route::Use(id) => {
                    if let Some(c) = lock(&self.table).1.get(&id) {
                        conn = Some((id, c.clone()));
                        break;
                    }
                    // Another task is connecting it.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Route::Open(id, _) => {
                    let c = Conn::connect(addr).await;
                    let mut t = lock(&self.table);
                    let now = self.clock.now();
                    match c {
                        Ok(c) => {
                            t.0.handle_connected(now, id);
                            t.1.insert(id, c.clone());
                            conn = Some((id, c));
                            break;
                        }
                        Err(_) => {
                            let mut rng = SplitMix64::new(op);
                            t.0.handle_connect_failed(now, id, &mut rng);
                            return Err(Disconnected);
                        }
                    }
                }
                Route::Wait { until } => self.clock.sleep_until(until).await,
                _ => return Err(Disconnected),
            }
        }
        let Some((id, c)) = conn else {
            return Err(Disconnected);
        };
        let _ = lock(&self.table).0.handle_send(self.clock.now(), id);
        let res = c.call_timeout(Request::admin(op), ADMIN_TIMEOUT).await;
        let mut t = lock(&self.table);
        let now = self.clock.now();
        let _ = t.0.handle_finished(now, id);
        if res.is_err() && c.is_closed() {
            t.0.handle_closed(now, id);
            t.1.remove(&id);
        }
        res.map(|(s, _)| s)
    }

    /// One coalesced metadata refresh: the first caller asks a coordinator for the leader,
    /// later callers wait for that answer.
    async fn refresh(&self, me: usize) -> bool {
        let action = {
            let mut r = lock(&self.refresh);
            let a = r.0.handle_refresh_needed(me);
            if let CoalesceAction::Join(_) = a {
                let (tx, rx) = oneshot::channel();
                r.1.insert(me, tx);
                Some(Err(rx))
            } else if let CoalesceAction::Start(g) = a {
                Some(Ok(g))
            } else {
                None
            }
        };
        match action {
            Some(Err(rx)) => rx.await.unwrap_or(false),
            Some(Ok(g)) => {
                let mut ok = false;
                for addr in self.coordinators {
                    let Ok(c) = Conn::connect(addr).await else {
                        continue;
                    };
                    if let Ok((Status::Ok, p)) = c.call(Request::metadata()).await
                        && let Some(b) = p.get(..2)
                    {
                        let port = u16::from_be_bytes([b[0], b[1]]);
                        *lock(&self.leader) = SocketAddr::new(addr.ip(), port);
                        ok = true;
                        break;
                    }
                }
                let mut r = lock(&self.refresh);
                let _ = r.0.handle_refreshed(g, ok);
                let mut mine = ok;
                while let Some(rel) = r.0.poll_release() {
                    if rel.waiter == me {
                        mine = rel.ok;
                    } else if let Some(tx) = r.1.remove(&rel.waiter) {
                        let _ = tx.send(rel.ok);
                    }
                }
                mine
            }
            None => false, // the coalescer is full: a failed refresh, which still retries
        }
    }
}

/// Admin writes: our client. Each write is a failover [`Call`] (admin-write preset: "not
/// leader" refreshes and retries, since the server refused before executing; a broken
/// connection refreshes and surfaces, since the write may have run). Connections are keyed
/// by (uid, host, port), so the new leader's address gets its own connection.
pub async fn ours_admin(
    coordinators: [SocketAddr; 2],
    first_leader: SocketAddr,
    tasks: usize,
    ops: mpsc::UnboundedReceiver<Op>,
    deadline: StdInstant,
) -> ClientStats {
    let Ok(table) = ConnTable::new(Default::default()) else {
        return ClientStats::default();
    };
    let admin = Arc::new(Admin {
        coordinators,
        leader: Mutex::new(first_leader),
        table: Mutex::new((table, HashMap::new())),
        refresh: Mutex::new((RefreshCoalescer::default(), HashMap::new())),
        clock: TokioClock::new(),
    });
    let ops = Arc::new(tokio::sync::Mutex::new(ops));
    let stats = Arc::new(Mutex::new(ClientStats::default()));
    let mut set = tokio::task::JoinSet::new();
    for me in 0..tasks {
        let (admin, ops, stats) = (admin.clone(), ops.clone(), stats.clone());
        set.spawn(async move {
            let mut rng = SplitMix64::new(me as u64);
            let cfg = CallConfig::default();
            loop {
                let Some(op) = ops.lock().await.recv().await else {
                    return;
                };
                let outcome = admin_write(&admin, me, op.id, &cfg, &mut rng, deadline).await;
                let mut s = lock(&stats);
                match outcome {
                    Some(true) => s.latencies.push(op.submitted.elapsed()),
                    Some(false) => s.failed += 1,
                    None => s.abandoned += 1,
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    std::mem::take(&mut *lock(&stats))
}

/// `Some(true)`: done; `Some(false)`: an error surfaced to the user (outcome unknown);
/// `None`: out of time.
async fn admin_write(
    admin: &Admin,
    me: usize,
    op: u64,
    cfg: &CallConfig,
    rng: &mut SplitMix64,
    deadline: StdInstant,
) -> Option<bool> {
    let mut budget = Unlimited;
    // A surfaced "not leader" provably did not execute, so the application may start a new
    // call for it; bounded, like everything else here.
    for _ in 0..8 {
        let mut call = Call::new(cfg);
        let mut last = ErrorKind::Fatal;
        let mut action = call.start(admin.clock.now(), &mut budget);
        for _ in 0..16 {
            if StdInstant::now() >= deadline {
                return None;
            }
            action = match action {
                CallAction::Send | CallAction::Retry { .. } => {
                    if let CallAction::Retry { after } = action {
                        tokio::time::sleep(after).await;
                    }
                    match admin.send(op).await {
                        Ok(Status::Ok) => call.handle_success(admin.clock.now(), &mut budget),
                        res => {
                            last = match res {
                                Ok(Status::NotLeader) => ErrorKind::NotLeader,
                                Err(Disconnected) => ErrorKind::Retriable,
                                Ok(_) => ErrorKind::Fatal,
                            };
                            let class = AdminWriteGateway.classify(&last);
                            call.handle_error(admin.clock.now(), class, &mut budget, rng)
                        }
                    }
                }
                CallAction::Refresh => {
                    let ok = admin.refresh(me).await;
                    call.handle_refreshed(admin.clock.now(), ok, &mut budget, rng)
                }
                CallAction::Complete => return Some(true),
                _ => break,
            };
        }
        if last != ErrorKind::NotLeader {
            return Some(false);
        }
    }
    Some(false)
}
