//! The two clients of every scenario.
//!
//! - naive: re-sends a rejected request at once, has no gate, dispatches every request as its
//!   own RPC with no bound on how many are in flight, keeps one connection per server uid at
//!   the address it first learned, and never refreshes metadata.
//! - ours: the core's drivers from `throttle_tokio::sync` on [`TokioRuntime`]: for writes a
//!   [`WriteDriver`] (the core paced writer owns the send loop; the demo protocol's answers go
//!   through [`DemoClassifier`]), for reads a [`BatchDriver`] over [`ReadTransport`], and for
//!   admin writes a [`FailoverExecutor`] over a [`ConnPool`] keyed by (uid, host, port) whose
//!   connections come from [`TcpConnector`].

use super::conn::{Answer, Conn, Disconnected};
use super::proto::{Request, Status};
use super::server::lock;
use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};
use throttle_tokio::failover::{AdminWriteGateway, ErrorKind, Unlimited};
use throttle_tokio::paced_writer::{PacedWriterConfig, WriteOutcome};
use throttle_tokio::sync::{
    BatchDriver, BatchOutcome, CallError, ConnPool, Connector, FailoverExecutor, SendBatch,
    Transport, WriteClassifier, WriteDriver,
};
use throttle_tokio::{
    BatcherConfig, CallConfig, ConnKey, Signal, TcpConnector, ThrottleCurve, TokioRuntime,
    WriteGateConfig,
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

/// Our writer gives a batch up after this many retries (each one follows a rejection and the
/// wait its bucket's gate decides); the run's deadline comes first in every scenario.
const OURS_MAX_RETRIES: u32 = 1_000;

/// Our writer's batches stop before this many bytes (a write counts its value and its 12-byte
/// header on the wire): the byte bound of the write batcher the demo used before, without its
/// 1000-operation cap (the paced writer bounds bytes only).
const OURS_BATCH_BYTES: u64 = 128 * 1024;

/// The one tablet server: every bucket's leader.
const TABLET: u32 = 0;

/// The demo protocol's answer to one WRITE RPC, as [`WriteDriver`] hands it to
/// [`DemoClassifier`].
type WriteAnswer = Result<Answer, Disconnected>;

/// The demo protocol's [`WriteClassifier`]: OK carries the piggybacked KV pressure (ppm in
/// the payload's first 4 bytes), the two refusals before executing are the disk and L0
/// signals, a malformed request is fatal, and anything else (a broken connection, a status
/// a tablet server never sends) is retriable.
#[derive(Clone, Copy, Debug)]
pub struct DemoClassifier;

impl WriteClassifier<WriteAnswer> for DemoClassifier {
    fn classify(&self, answer: &WriteAnswer) -> WriteOutcome {
        classify_write(answer)
    }
}

fn classify_write(answer: &WriteAnswer) -> WriteOutcome {
    match answer {
        Ok((Status::Ok, payload)) => {
            let ppm = payload
                .get(..4)
                .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            WriteOutcome::Ok {
                pressure: Signal::from_ppm(ppm),
            }
        }
        Ok((Status::DiskWriteLocked, _)) => WriteOutcome::DiskWriteLocked,
        Ok((Status::StorageBackpressure, _)) => WriteOutcome::StorageBackpressure,
        Ok((Status::BadRequest, _)) => WriteOutcome::Fatal,
        Ok((Status::NotLeader, _)) | Err(Disconnected) => WriteOutcome::Retriable,
    }
}

/// The send closure's body: one WRITE RPC per batch (the protocol carries one bucket per
/// request), all on the pipelined connection at once; one answer per batch, in order.
async fn send_writes(conn: Conn, batches: Vec<SendBatch<u32, Op>>) -> Vec<WriteAnswer> {
    let calls: Vec<_> = batches
        .into_iter()
        .map(|b| {
            let (conn, req) = (conn.clone(), request(true, b.bucket, &b.records));
            tokio::spawn(async move { conn.call(req).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(calls.len());
    for call in calls {
        answers.push(call.await.unwrap_or(Err(Disconnected)));
    }
    answers
}

/// Our client for writes: a [`WriteDriver`] on [`TokioRuntime`], the core paced writer with
/// the Fluss gate (disk-write-locked backoff, the landed KV pressure curve). The writer
/// decides everything: per-bucket batches (records appended while a bucket waits join its
/// next batch), one batch in flight per bucket, which buckets the gate lets send, retries up
/// to [`OURS_MAX_RETRIES`], probes, and when to wake. The demo only appends each operation
/// as it arrives and maps the protocol's answers through [`DemoClassifier`].
async fn ours_writes(
    conn: Conn,
    mut ops: mpsc::UnboundedReceiver<Op>,
    deadline: StdInstant,
    seed: u64,
) -> ClientStats {
    let gate = gate_config();
    let cfg = PacedWriterConfig::default()
        .with_gate(gate)
        .with_batch_bytes(OURS_BATCH_BYTES)
        .with_max_retries(OURS_MAX_RETRIES);
    let send = move |_tablet: u32, batches| send_writes(conn.clone(), batches);
    let Ok(driver) = WriteDriver::new(TokioRuntime::new(), cfg, send, DemoClassifier) else {
        return ClientStats::default();
    };
    driver.reseed(seed);
    let stats = Arc::new(Mutex::new(ClientStats::default()));
    let deadline = tokio::time::Instant::from_std(deadline);
    let mut known = HashSet::new();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(op) = ops.recv().await {
        // The metadata: the one tablet server leads every bucket.
        if known.insert(op.shard) {
            driver.set_leader(op.shard, Some(TABLET));
        }
        let written = driver.append(op.shard, op, u64::from(op.len) + 12);
        tasks.spawn(tally(stats.clone(), deadline, op.submitted, written));
    }
    while tasks.join_next().await.is_some() {}
    driver.close();
    // Batches still in flight at the deadline end on their answers (or the server's stop).
    let _ = tokio::time::timeout(Duration::from_secs(1), driver.closed()).await;
    std::mem::take(&mut *lock(&stats))
}

/// The demo protocol's READ RPC as the [`BatchDriver`]'s [`Transport`]: one RPC per batch on
/// one pipelined connection; any answer but OK fails the batch.
#[derive(Clone, Debug)]
pub struct ReadTransport {
    conn: Conn,
}

/// A read batch that got no OK: refused, or the connection broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadFailed;

impl Transport<u32, Op> for ReadTransport {
    type Output = ();
    type Error = ReadFailed;

    fn op_bytes(&self, _op: &Op) -> u64 {
        8
    }

    fn send(
        &self,
        shard: &u32,
        ops: Vec<Op>,
    ) -> impl Future<Output = BatchOutcome<(), ReadFailed>> + Send + 'static {
        let (conn, req) = (self.conn.clone(), request(false, *shard, &ops));
        async move {
            match conn.call(req).await {
                Ok((Status::Ok, _)) => Ok(vec![Ok(()); ops.len()]),
                _ => Err(ReadFailed),
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

/// Our client for reads: a [`BatchDriver`] (per-shard batches, at most 4 in flight per shard,
/// batches grow while the window is exhausted) over [`ReadTransport`]. Each read is submitted
/// as it arrives; a failed batch fails its reads (the shard server never refuses one).
async fn ours_reads(
    conn: Conn,
    mut ops: mpsc::UnboundedReceiver<Op>,
    deadline: StdInstant,
) -> ClientStats {
    let cfg = BatcherConfig::reads();
    let driver = BatchDriver::new(TokioRuntime::new(), ReadTransport { conn }, cfg);
    let stats = Arc::new(Mutex::new(ClientStats::default()));
    let deadline = tokio::time::Instant::from_std(deadline);
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(op) = ops.recv().await {
        // Submitted here, not in the task: the driver sees every read already queued before
        // it flushes, so batches fill up.
        let read = driver.submit(op.shard, op);
        tasks.spawn(tally(stats.clone(), deadline, op.submitted, read));
    }
    while tasks.join_next().await.is_some() {}
    driver.close();
    std::mem::take(&mut *lock(&stats))
}

/// Waits for one of our operations until the run's deadline and counts how it ended: its
/// latency on success, `failed` on an error, `abandoned` at the deadline.
async fn tally<E>(
    stats: Arc<Mutex<ClientStats>>,
    deadline: tokio::time::Instant,
    submitted: StdInstant,
    op: impl Future<Output = Result<(), E>>,
) {
    let result = tokio::time::timeout_at(deadline, op).await;
    let mut s = lock(&stats);
    match result {
        Ok(Ok(())) => s.latencies.push(submitted.elapsed()),
        Ok(Err(_)) => s.failed += 1,
        Err(_) => s.abandoned += 1,
    }
}

/// Our client for writes ([`WriteDriver`]) or reads ([`BatchDriver`]) on one connection.
pub async fn ours_data(
    addr: SocketAddr,
    write: bool,
    mut ops: mpsc::UnboundedReceiver<Op>,
    deadline: StdInstant,
    seed: u64,
) -> ClientStats {
    let Ok(conn) = Conn::connect(addr).await else {
        let mut stats = ClientStats::default();
        while ops.recv().await.is_some() {
            stats.abandoned += 1;
        }
        return stats;
    };
    if write {
        ours_writes(conn, ops, deadline, seed).await
    } else {
        ours_reads(conn, ops, deadline).await
    }
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
        attempt: throttle_sansio::conn_key::ConnectAttempt,
    ) -> impl Future<Output = std::io::Result<Conn>> + Send + 'static {
        let stream = TcpConnector.connect(host, port, attempt);
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
            if let Ok((Status::Ok, p)) = lease.call(Request::metadata()).await {
                if let Some(b) = p.get(..2) {
                    let port = u16::from_be_bytes([b[0], b[1]]);
                    *lock(&self.leader) = SocketAddr::new(addr.ip(), port);
                    return true;
                }
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

#[cfg(test)]
mod tests {
    use super::super::server::{Tablet, TabletConfig};
    use super::*;
    use throttle_tokio::PressureConfig;

    fn writes(first_id: u64, n: u64) -> Vec<u8> {
        let w: Vec<(u64, u32)> = (first_id..first_id + n).map(|id| (id, 1_000)).collect();
        Request::write(0, &w).payload().to_vec()
    }

    /// The tablet server's own answers, sorted by [`DemoClassifier`]: the disk lock, the
    /// pressure it piggybacks as L0 grows (read from the payload, not dropped), the L0
    /// refusal; and the answers a tablet server does not give.
    #[test]
    fn the_tablet_servers_answers_classify_into_the_paced_writers_inputs() {
        let tablet = |protect| {
            Tablet::new(
                TabletConfig {
                    protect,
                    flush_bytes: 64 << 10,
                    compact_every: Duration::from_secs(3_600),
                    pressure: PressureConfig::fluss_landed(),
                },
                10_000,
            )
        };
        let c = DemoClassifier;
        let locked = tablet(Duration::from_secs(3_600));
        assert_eq!(
            c.classify(&Ok(locked.serve_write(&writes(0, 1)))),
            WriteOutcome::DiskWriteLocked
        );
        // Each round is one memtable or more: one L0 file, no compaction.
        let t = tablet(Duration::ZERO);
        let (mut pressures, mut refused) = (Vec::new(), false);
        for round in 0..40 {
            let answer = t.serve_write(&writes(round * 70, 70));
            let ppm = answer
                .1
                .get(..4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            match c.classify(&Ok(answer)) {
                WriteOutcome::Ok { pressure } => {
                    assert_eq!(pressure, Signal::from_ppm(ppm.expect("OK carries the ppm")));
                    pressures.push(pressure);
                }
                WriteOutcome::StorageBackpressure => {
                    refused = true;
                    break;
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert!(refused, "L0 reached the trigger: refused");
        assert!(
            pressures.iter().any(|p| *p != Signal::Clear),
            "the piggybacked pressure reaches the writer: {pressures:?}"
        );
        assert_eq!(c.classify(&Err(Disconnected)), WriteOutcome::Retriable);
        assert_eq!(
            c.classify(&Ok((Status::NotLeader, Vec::new()))),
            WriteOutcome::Retriable
        );
        assert_eq!(
            c.classify(&Ok((Status::BadRequest, Vec::new()))),
            WriteOutcome::Fatal
        );
        assert_eq!(
            c.classify(&Ok((Status::Ok, Vec::new()))),
            WriteOutcome::Ok {
                pressure: Signal::Clear
            }
        );
    }
}
