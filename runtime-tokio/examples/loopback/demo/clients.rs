//! The two clients of every scenario.
//!
//! - naive: re-sends a rejected request at once, has no gate, dispatches every request as its
//!   own RPC with no bound on how many are in flight, keeps one connection per server uid at
//!   the address it first learned, and never refreshes metadata.
//! - ours: the core's drivers from `throttle_tokio::sync` on [`TokioRuntime`]: a
//!   [`BatchDriver`] over the demo protocol ([`DemoTransport`]), a [`GateHandle`] whose
//!   `wait_until_open` paces each write, and for admin writes a [`FailoverExecutor`] over a
//!   [`ConnPool`] keyed by (uid, host, port) whose connections come from [`TcpConnector`].

use super::conn::{Conn, Disconnected};
use super::proto::{Request, Status};
use super::server::lock;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};
use throttle_tokio::failover::{AdminWriteGateway, ErrorKind, Unlimited};
use throttle_tokio::rng::SplitMix64;
use throttle_tokio::sync::{
    BatchDriver, BatchOutcome, CallError, ConnPool, Connector, FailoverExecutor, GateHandle,
    OpError, Transport,
};
use throttle_tokio::{
    BatcherConfig, CallConfig, ConnKey, GateState, Signal, TcpConnector, ThrottleCurve,
    TokioRuntime, WindowConfig, WriteGateConfig,
};
use tokio::sync::mpsc;

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

/// How long an admin write waits for its response before it counts as lost (both clients).
pub const ADMIN_TIMEOUT: Duration = Duration::from_millis(250);

/// The coordinators' server uid (both share it, as in Fluss: `cs-0`).
const COORDINATOR_UID: u32 = 0;

/// Upper bound on how often our client submits one operation (each submission follows a
/// rejection and a wait for the bucket's gate).
const OURS_MAX_ATTEMPTS: u32 = 1_000;

/// One operation as our data client submits it: with the number of times a batch holding it
/// was refused with `DISK_WRITE_LOCKED`, which drives the disk backoff's growth.
#[derive(Clone, Copy, Debug)]
pub struct Attempt {
    pub op: Op,
    pub disk_rejections: u32,
}

/// Why a batch sent through [`DemoTransport`] has no results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The bucket's gate closed while the batch waited for credit; sent nothing (upstream's
    /// `shouldSkipBucket` at drain).
    Skipped,
    /// `DISK_WRITE_LOCKED`: refused before executing.
    DiskWriteLocked,
    /// L0 at the slowdown trigger: refused before executing.
    Backpressure,
    /// Disconnected or refused for another reason.
    Failed,
}

/// The demo protocol as the [`BatchDriver`]'s [`Transport`]: one WRITE or READ RPC per batch on
/// one pipelined connection. For writes it also feeds the batch's outcome to the shared
/// [`GateHandle`] (success and piggybacked pressure, disk backoff, storage backpressure,
/// retriable backoff), and skips a batch whose bucket's gate closed while it was parked.
#[derive(Clone, Debug)]
pub struct DemoTransport {
    conn: Conn,
    write: bool,
    rt: TokioRuntime,
    gate: GateHandle<u32>,
    rng: Arc<Mutex<SplitMix64>>,
}

impl Transport<u32, Attempt> for DemoTransport {
    type Output = ();
    type Error = Refused;

    fn op_bytes(&self, op: &Attempt) -> u64 {
        u64::from(op.op.len) + 12
    }

    fn send(
        &self,
        shard: &u32,
        ops: Vec<Attempt>,
    ) -> impl Future<Output = BatchOutcome<(), Refused>> + Send + 'static {
        let (shard, this) = (*shard, self.clone());
        async move {
            let DemoTransport {
                conn,
                write,
                rt,
                gate,
                rng,
            } = this;
            if write && matches!(gate.check(rt.now(), &shard), GateState::Closed { .. }) {
                return Err(Refused::Skipped);
            }
            let plain: Vec<Op> = ops.iter().map(|a| a.op).collect();
            let res = conn.call(request(write, shard, &plain)).await;
            let now = rt.now();
            match res {
                Ok((Status::Ok, payload)) => {
                    if write {
                        let ppm = payload
                            .get(..4)
                            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                        gate.handle_success(now, &shard);
                        gate.handle_kv_signal(now, &shard, Signal::from_ppm(ppm));
                    }
                    Ok(vec![Ok(()); ops.len()])
                }
                Ok((Status::DiskWriteLocked, _)) => {
                    // The batch's attempt count before this retry (first rejection: 0).
                    let attempts = ops.iter().map(|a| a.disk_rejections).max().unwrap_or(0);
                    gate.handle_disk_write_locked(now, &shard, attempts, &mut *lock(&rng));
                    Err(Refused::DiskWriteLocked)
                }
                Ok((Status::StorageBackpressure, _)) => {
                    gate.handle_kv_signal(now, &shard, Signal::Full);
                    Err(Refused::Backpressure)
                }
                _ => {
                    gate.handle_retriable_write(now, &shard, 0, &mut *lock(&rng));
                    Err(Refused::Failed)
                }
            }
        }
    }
}

/// Our client's gate in both tablet scenarios: the default backoffs with the landed KV curve,
/// [`ThrottleCurve::fluss_landed`] (`max_throttle · p²`, 3000 ms), the client half of the
/// pairing whose server half is [`TABLET_PRESSURE`](super::scenario::TABLET_PRESSURE).
pub fn gate_config() -> WriteGateConfig {
    WriteGateConfig::default().with_kv_curve(ThrottleCurve::fluss_landed())
}

type DataDriver = BatchDriver<TokioRuntime, DemoTransport, u32, Attempt>;

/// Our client for writes or reads: a [`BatchDriver`] (per-shard batches, at most 4 in flight
/// per shard, batches grow while the window is exhausted) over [`DemoTransport`], and a
/// [`GateHandle`] (disk-write-locked backoff, KV pressure throttle). Each operation is one
/// task: it waits with `wait_until_open` for its bucket, submits, and on a refused batch waits
/// for the gate again and resubmits.
pub async fn ours_data(
    addr: SocketAddr,
    write: bool,
    mut ops: mpsc::UnboundedReceiver<Op>,
    deadline: StdInstant,
    seed: u64,
) -> ClientStats {
    let stats = Arc::new(Mutex::new(ClientStats::default()));
    let Ok(conn) = Conn::connect(addr).await else {
        let mut stats = ClientStats::default();
        while ops.recv().await.is_some() {
            stats.abandoned += 1;
        }
        return stats;
    };
    let rt = TokioRuntime::new();
    let gate: GateHandle<u32> =
        GateHandle::new(gate_config()).expect("the Fluss gate config is valid");
    let transport = DemoTransport {
        conn,
        write,
        rt: rt.clone(),
        gate: gate.clone(),
        rng: Arc::new(Mutex::new(SplitMix64::new(seed))),
    };
    let cfg = if write {
        BatcherConfig::writes()
    } else {
        BatcherConfig::reads()
    }
    .with_window(WindowConfig::default());
    let Ok(driver) = DataDriver::new(rt.clone(), transport, cfg) else {
        return ClientStats::default();
    };
    // The gate's timer loop only frees memory of expired gates; stopped with the client.
    let evictor = {
        let (gate, rt) = (gate.clone(), rt.clone());
        tokio::spawn(async move { gate.drive_timeouts(&rt).await })
    };
    let deadline = tokio::time::Instant::from_std(deadline);
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(op) = ops.recv().await {
        // Submitted here, not in the task, when the bucket is open: the driver sees every
        // operation already queued before it flushes, so batches fill up.
        let first = match gate.check(rt.now(), &op.shard) {
            GateState::Closed { .. } => None,
            _ => Some(driver.submit(
                op.shard,
                Attempt {
                    op,
                    disk_rejections: 0,
                },
            )),
        };
        let (driver, gate, rt, stats) = (driver.clone(), gate.clone(), rt.clone(), stats.clone());
        tasks.spawn(async move {
            let done = tokio::time::timeout_at(deadline, one_op(&driver, &gate, &rt, op, first))
                .await
                .unwrap_or(false);
            let mut s = lock(&stats);
            if done {
                s.latencies.push(op.submitted.elapsed());
            } else {
                s.abandoned += 1;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    driver.close();
    evictor.abort();
    std::mem::take(&mut *lock(&stats))
}

/// Drives one operation to its result: wait for the bucket's gate, submit, repeat on a
/// refused batch. `first` is a submission already made.
async fn one_op(
    driver: &DataDriver,
    gate: &GateHandle<u32>,
    rt: &TokioRuntime,
    op: Op,
    mut first: Option<throttle_tokio::sync::Submit<(), Refused>>,
) -> bool {
    let mut disk_rejections = 0u32;
    for _ in 0..OURS_MAX_ATTEMPTS {
        let submit = match first.take() {
            Some(s) => s,
            None => {
                // Open, or probing (a submission is the probe); no leader tracking here.
                let _ = gate.wait_until_open(rt, &op.shard).await;
                driver.submit(
                    op.shard,
                    Attempt {
                        op,
                        disk_rejections,
                    },
                )
            }
        };
        match submit.await {
            Ok(()) => return true,
            Err(OpError::Batch(e)) if *e == Refused::DiskWriteLocked => {
                disk_rejections = disk_rejections.saturating_add(1)
            }
            // Every other refusal fed the gate first (or found it closed): wait and resubmit.
            Err(OpError::Batch(_) | OpError::NoResponse | OpError::Op(_)) => {}
            Err(_) => return false, // the driver closed, or the transport panicked
        }
    }
    false
}

/// Our connector: tokio's [`TcpConnector`] (TCP_NODELAY) with the demo's pipelined client on
/// top, so every lease of an endpoint shares one connection.
#[derive(Clone, Copy, Debug, Default)]
pub struct DemoConnector;

impl Connector<String> for DemoConnector {
    type Conn = Conn;
    type Error = std::io::Error;

    fn connect(
        &self,
        host: &String,
        port: u16,
    ) -> impl Future<Output = std::io::Result<Conn>> + Send + 'static {
        let stream = TcpConnector.connect(host, port);
        async move { Ok(Conn::from_stream(stream.await?)) }
    }
}

type AdminPool = ConnPool<TokioRuntime, DemoConnector, u32, String>;

/// Shared state of our admin client: the leader's address as last learned, and the pool.
#[derive(Debug)]
struct Admin {
    coordinators: [SocketAddr; 2],
    leader: Mutex<SocketAddr>,
    pool: AdminPool,
}

fn coordinator_key(addr: SocketAddr) -> ConnKey<u32, String> {
    ConnKey::new(COORDINATOR_UID, addr.ip().to_string(), addr.port())
}

impl Admin {
    /// Sends one admin write on the pooled connection for the current leader's endpoint.
    async fn send(&self, op: u64) -> Result<(), ErrorKind> {
        let addr = *lock(&self.leader);
        // A lease that failed sent nothing; counted as retriable, like a disconnect (the
        // coordinators never go down in this scenario).
        let lease = self
            .pool
            .lease(&coordinator_key(addr))
            .await
            .map_err(|_| ErrorKind::Retriable)?;
        match lease.call_timeout(Request::admin(op), ADMIN_TIMEOUT).await {
            Ok((Status::Ok, _)) => Ok(()),
            Ok((Status::NotLeader, _)) => Err(ErrorKind::NotLeader),
            Ok(_) => Err(ErrorKind::Fatal),
            Err(Disconnected) => {
                if lease.is_closed() {
                    lease.broken();
                }
                Err(ErrorKind::Retriable)
            }
        }
    }

    /// One metadata refresh (the executor runs at most one at a time; concurrent callers join
    /// it): ask each coordinator for the leader's port.
    async fn refresh(&self) -> bool {
        for addr in self.coordinators {
            let Ok(lease) = self.pool.lease(&coordinator_key(addr)).await else {
                continue;
            };
            if let Ok((Status::Ok, p)) = lease.call(Request::metadata()).await
                && let Some(b) = p.get(..2)
            {
                let port = u16::from_be_bytes([b[0], b[1]]);
                *lock(&self.leader) = SocketAddr::new(addr.ip(), port);
                return true;
            }
        }
        false
    }
}

/// Admin writes: our client. Each write is one [`FailoverExecutor::call`] with the
/// admin-write preset ("not leader" refreshes and retries, since the server refused before
/// executing; a lost response refreshes and surfaces, since the write may have run), the
/// refresh coalesced across the `tasks` callers. Connections come from a [`ConnPool`] keyed
/// by (uid, host, port), so the new leader's address gets its own connection.
pub async fn ours_admin(
    coordinators: [SocketAddr; 2],
    first_leader: SocketAddr,
    tasks: usize,
    ops: mpsc::UnboundedReceiver<Op>,
    deadline: StdInstant,
    seed: u64,
) -> ClientStats {
    let rt = TokioRuntime::new();
    let (Ok(pool), Ok(exec)) = (
        AdminPool::new(rt.clone(), DemoConnector, Default::default()),
        FailoverExecutor::new(rt, AdminWriteGateway, Unlimited, CallConfig::default()),
    ) else {
        return ClientStats::default();
    };
    exec.reseed(seed);
    let idle = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.drive_timeouts().await })
    };
    let admin = Arc::new(Admin {
        coordinators,
        leader: Mutex::new(first_leader),
        pool: pool.clone(),
    });
    let deadline = tokio::time::Instant::from_std(deadline);
    let ops = Arc::new(tokio::sync::Mutex::new(ops));
    let stats = Arc::new(Mutex::new(ClientStats::default()));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (admin, exec, ops, stats) = (admin.clone(), exec.clone(), ops.clone(), stats.clone());
        set.spawn(async move {
            loop {
                let Some(op) = ops.lock().await.recv().await else {
                    return;
                };
                let outcome = tokio::time::timeout_at(deadline, admin_write(&admin, &exec, op.id))
                    .await
                    .ok();
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
    idle.abort();
    pool.close();
    std::mem::take(&mut *lock(&stats))
}

/// `true`: done; `false`: an error surfaced to the user (outcome unknown).
async fn admin_write(
    admin: &Arc<Admin>,
    exec: &FailoverExecutor<TokioRuntime, AdminWriteGateway, Unlimited>,
    op: u64,
) -> bool {
    // A surfaced "not leader" provably did not execute, so the application may start a new
    // call for it; bounded, like everything else here.
    for _ in 0..8 {
        let result = exec
            .call(
                || {
                    let admin = admin.clone();
                    async move { admin.send(op).await }
                },
                || {
                    let admin = admin.clone();
                    async move { admin.refresh().await }
                },
            )
            .await;
        match result {
            Ok(()) => return true,
            Err(CallError::Surfaced(s)) if s.error == ErrorKind::NotLeader => continue,
            Err(_) => return false,
        }
    }
    false
}
