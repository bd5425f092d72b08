//! The loopback servers: a tablet server, a shard server and a pair of coordinators. Each
//! counts what it receives and how long it spent serving it; the tablet server also measures
//! how long it was overloaded. The table is printed from these counters.

use super::proto::{self, Reader, Status};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use throttle_sansio::{Decision, PressureConfig, ServerPressure};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What a server received, and how often each write id was executed.
#[derive(Debug)]
pub struct Counters {
    pub rpcs: AtomicU64,
    pub bytes: AtomicU64,
    pub ops: AtomicU64,
    /// RPCs answered with a refusal (disk locked, storage backpressure, not leader).
    pub refused: AtomicU64,
    /// Time spent serving requests, summed over connections: from a request's frame read to
    /// its response flushed (or dropped), in nanoseconds.
    pub busy_ns: AtomicU64,
    executed: Mutex<Vec<u32>>,
}

impl Counters {
    pub fn new(ids: usize) -> Arc<Self> {
        Arc::new(Counters {
            rpcs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            executed: Mutex::new(vec![0; ids]),
        })
    }
    fn received(&self, frame_bytes: usize, ops: u64) {
        self.rpcs.fetch_add(1, Ordering::Relaxed);
        self.bytes
            .fetch_add(frame_bytes as u64 + 4, Ordering::Relaxed);
        self.ops.fetch_add(ops, Ordering::Relaxed);
    }
    /// The time spent serving requests.
    pub fn busy(&self) -> Duration {
        Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed))
    }
    fn served(&self, status: Option<Status>, took: Duration) {
        if matches!(
            status,
            Some(Status::DiskWriteLocked | Status::StorageBackpressure | Status::NotLeader)
        ) {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }
    fn execute(&self, id: u64) {
        let mut ex = lock(&self.executed);
        if let Some(n) = usize::try_from(id).ok().and_then(|i| ex.get_mut(i)) {
            *n = n.saturating_add(1);
        }
    }
    /// (executed exactly once, executed more than once, never executed)
    pub fn execution(&self) -> (usize, usize, usize) {
        let ex = lock(&self.executed);
        let once = ex.iter().filter(|&&n| n == 1).count();
        let twice = ex.iter().filter(|&&n| n > 1).count();
        (once, twice, ex.len() - once - twice)
    }
}

/// Tablet server settings.
#[derive(Clone, Debug)]
pub struct TabletConfig {
    /// Writes are refused with DISK_WRITE_LOCKED for this long after start.
    pub protect: Duration,
    /// Memtable size: every this many accepted bytes become one L0 file.
    pub flush_bytes: u64,
    /// Compaction removes one L0 file per this interval.
    pub compact_every: Duration,
    pub pressure: PressureConfig,
}

/// What the tablet server measured about its own state during a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TabletReport {
    /// Time it refused writes to protect itself: disk locked, or L0 at or above the slowdown
    /// trigger (see [`Tablet::report`]).
    pub overloaded: Duration,
    /// Its disk-protection window (writes refused for this long after start).
    pub disk_lock: Duration,
    /// When it accepted its first write, after its start, and when the last bucket to get a
    /// write accepted got its first one.
    pub first_accept: Option<Duration>,
    pub last_bucket_first_accept: Option<Duration>,
    /// The L0 file count from which it reports pressure (`Tf`), its slowdown trigger (from
    /// which it rejects) and its memtable size.
    pub pressure_from: u32,
    pub slowdown_trigger: u32,
    pub flush_bytes: u64,
    /// Highest L0 file count reached, and the accepted RPC that raised L0 to it.
    pub peak_l0: u64,
    pub peak_rpc: PeakRpc,
    /// Accepted RPCs whose bytes flushed two or more L0 files at once.
    pub multi_file_rpcs: u64,
}

/// The accepted write RPC that raised L0 to its highest count, as the tablet server saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeakRpc {
    /// L0 files when the RPC was admitted (always below the slowdown trigger: admission
    /// rejects from the trigger on).
    pub l0_before: u64,
    /// L0 files the RPC's bytes flushed at once.
    pub files_added: u64,
    /// Writes and value-plus-header bytes the RPC carried.
    pub ops: u64,
    pub bytes: u64,
}

#[derive(Debug)]
struct TabletState {
    pressure: ServerPressure,
    memtable: u64,
    l0: u64,
    compacted_at: Instant,
    /// Time L0 spent at or above the slowdown trigger in finished episodes.
    overloaded: Duration,
    /// The episode under way: (start, end). No write is admitted during an episode, and
    /// compaction drains L0 at a fixed rate, so its end is known when it starts.
    episode: Option<(Instant, Instant)>,
    peak: PeakRpc,
    /// When each bucket got its first write accepted, after the start.
    first_accept: std::collections::BTreeMap<u32, Duration>,
    multi_file_rpcs: u64,
}

#[derive(Debug)]
pub struct Tablet {
    cfg: TabletConfig,
    started: Instant,
    state: Mutex<TabletState>,
    pub counters: Arc<Counters>,
    pub max_l0: AtomicU64,
}

impl Tablet {
    pub fn new(cfg: TabletConfig, ids: usize) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Tablet {
            state: Mutex::new(TabletState {
                pressure: ServerPressure::new(cfg.pressure),
                memtable: 0,
                l0: 0,
                compacted_at: now,
                overloaded: Duration::ZERO,
                episode: None,
                peak: PeakRpc::default(),
                first_accept: Default::default(),
                multi_file_rpcs: 0,
            }),
            cfg,
            started: now,
            counters: Counters::new(ids),
            max_l0: AtomicU64::new(0),
        })
    }

    fn handle(&self, body: &[u8]) -> (Status, Vec<u8>) {
        let mut r = Reader::new(body);
        let (Some(bucket), Some(n)) = (r.u32(), r.u32()) else {
            return (Status::BadRequest, Vec::new());
        };
        self.counters.received(body.len() + 9, u64::from(n));
        let now = Instant::now();
        if now.duration_since(self.started) < self.cfg.protect {
            return (Status::DiskWriteLocked, Vec::new());
        }
        let mut st = lock(&self.state);
        // Compaction runs in the background at a fixed rate; catch up on it lazily, keeping
        // the part of an interval already elapsed.
        let every = self.cfg.compact_every.max(Duration::from_micros(1));
        let due = now.duration_since(st.compacted_at).as_nanos() / every.as_nanos();
        if due > 0 {
            let due = u32::try_from(due).unwrap_or(u32::MAX);
            st.l0 = st.l0.saturating_sub(u64::from(due));
            st.compacted_at += every.saturating_mul(due);
        }
        if let Some((start, end)) = st.episode {
            if end <= now {
                st.overloaded += end.saturating_duration_since(start);
                st.episode = None;
            }
        }
        let l0 = st.l0;
        st.pressure.handle_l0(l0);
        if let Decision::Reject { .. } = st.pressure.decide() {
            return (Status::StorageBackpressure, Vec::new());
        }
        let mut ids = Vec::with_capacity(n as usize);
        let memtable_before = st.memtable;
        for _ in 0..n {
            let (Some(id), Some(len)) = (r.u64(), r.u32()) else {
                return (Status::BadRequest, Vec::new());
            };
            if r.take(len as usize).is_none() {
                return (Status::BadRequest, Vec::new());
            }
            ids.push(id);
            st.memtable = st.memtable.saturating_add(u64::from(len) + 12);
        }
        for id in ids {
            self.counters.execute(id);
        }
        let flush = self.cfg.flush_bytes.max(1);
        let files = st.memtable / flush;
        st.l0 = st.l0.saturating_add(files);
        st.multi_file_rpcs += u64::from(files >= 2);
        st.first_accept
            .entry(bucket)
            .or_insert_with(|| now.duration_since(self.started));
        st.memtable %= flush;
        if st.l0 > self.max_l0.fetch_max(st.l0, Ordering::Relaxed) {
            st.peak = PeakRpc {
                l0_before: l0,
                files_added: files,
                ops: u64::from(n),
                bytes: st.memtable + files * flush - memtable_before,
            };
        }
        let l0 = st.l0;
        st.pressure.handle_l0(l0);
        if files > 0 && st.episode.is_none() {
            // Overloaded while the core's admission rejects: find when compaction brings L0
            // back to a count it accepts (the lazy catch-up above runs from `compacted_at`).
            let mut probe = st.pressure.clone();
            let mut k = 0u32;
            while matches!(probe.decide(), Decision::Reject { .. }) && u64::from(k) < l0 {
                k += 1;
                probe.handle_l0(l0 - u64::from(k));
            }
            if k > 0 {
                st.episode = Some((now, st.compacted_at + every.saturating_mul(k)));
            }
        }
        // The signal piggybacked on the response: the pressure after this write.
        let ppm = match st.pressure.decide() {
            Decision::Accept { pressure_ppm } => pressure_ppm,
            _ => 999_999,
        };
        (Status::Ok, ppm.to_be_bytes().to_vec())
    }
}

impl Tablet {
    /// What the server measured between its start and `until`. Its overloaded time is the
    /// disk-protection window (as far as `until`) plus every stretch with L0 at or above the
    /// slowdown trigger, from the write that raised L0 there to the compaction that brought it
    /// back to a count the core's `ServerPressure` admits.
    pub fn report(&self, until: Instant) -> TabletReport {
        let ran = until.saturating_duration_since(self.started);
        let locked = self.cfg.protect.min(ran);
        let st = lock(&self.state);
        let current = st.episode.map_or(Duration::ZERO, |(start, end)| {
            end.min(until).saturating_duration_since(start)
        });
        TabletReport {
            overloaded: locked + st.overloaded + current,
            disk_lock: self.cfg.protect,
            first_accept: st.first_accept.values().min().copied(),
            last_bucket_first_accept: st.first_accept.values().max().copied(),
            pressure_from: self.cfg.pressure.l0_trigger(),
            slowdown_trigger: self.cfg.pressure.l0_slowdown_writes_trigger(),
            flush_bytes: self.cfg.flush_bytes,
            peak_l0: self.max_l0.load(Ordering::Relaxed),
            peak_rpc: st.peak,
            multi_file_rpcs: st.multi_file_rpcs,
        }
    }

    /// Serves one WRITE request's payload (`bucket n n×(id len value)`), as a connection does.
    pub fn serve_write(&self, payload: &[u8]) -> (Status, Vec<u8>) {
        self.handle(payload)
    }
}

/// A shard server: every read RPC costs a fixed time, whatever it carries.
#[derive(Debug)]
pub struct Shard {
    pub rpc_cost: Duration,
    pub counters: Arc<Counters>,
}

impl Shard {
    async fn handle(&self, body: &[u8]) -> (Status, Vec<u8>) {
        let mut r = Reader::new(body);
        let (Some(_shard), Some(n)) = (r.u32(), r.u32()) else {
            return (Status::BadRequest, Vec::new());
        };
        self.counters.received(body.len() + 9, u64::from(n));
        tokio::time::sleep(self.rpc_cost).await;
        let mut out = Vec::with_capacity(8 * n as usize);
        for _ in 0..n {
            let Some(k) = r.u64() else {
                return (Status::BadRequest, Vec::new());
            };
            out.extend_from_slice(&k.wrapping_mul(31).to_be_bytes());
        }
        (Status::Ok, out)
    }
}

/// Two coordinators sharing one catalog; exactly one is leader at a time.
#[derive(Debug)]
pub struct Coordinators {
    pub leader: AtomicUsize,
    /// Bumped on every leadership change.
    pub epoch: AtomicU64,
    pub ports: Mutex<[u16; 2]>,
    pub write_cost: Duration,
    pub counters: Arc<Counters>,
}

impl Coordinators {
    pub fn swap(&self) {
        self.leader.fetch_xor(1, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// `None`: the request executed but its response is lost.
    async fn handle(&self, me: usize, kind: u8, body: &[u8]) -> Option<(Status, Vec<u8>)> {
        let mut r = Reader::new(body);
        let ops = u64::from(kind == proto::ADMIN);
        self.counters.received(body.len() + 9, ops);
        if kind == proto::METADATA {
            let leader = self.leader.load(Ordering::SeqCst);
            let port = lock(&self.ports).get(leader).copied().unwrap_or(0);
            return Some((Status::Ok, port.to_be_bytes().to_vec()));
        }
        let Some(op) = r.u64() else {
            return Some((Status::BadRequest, Vec::new()));
        };
        let epoch = self.epoch.load(Ordering::SeqCst);
        if self.leader.load(Ordering::SeqCst) != me {
            // Rejected before executing: safe to retry elsewhere.
            return Some((Status::NotLeader, Vec::new()));
        }
        tokio::time::sleep(self.write_cost).await;
        self.counters.execute(op);
        if self.epoch.load(Ordering::SeqCst) != epoch {
            // Leadership moved while the write ran: the resigning leader executed it but its
            // response is lost (the client times out not knowing whether it ran).
            return None;
        }
        Some((Status::Ok, Vec::new()))
    }
}

/// What a listener serves.
#[derive(Clone, Debug)]
pub enum Service {
    Tablet(Arc<Tablet>),
    Shard(Arc<Shard>),
    Coordinator(Arc<Coordinators>, usize),
}

/// A running server; [`Server::stop`] (or drop) ends its tasks.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Server {
    /// Listens on 127.0.0.1 with an OS-assigned port.
    pub async fn start(service: Service) -> std::io::Result<Server> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let conn_tasks = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let service = service.clone();
                let task = tokio::spawn(serve_conn(stream, service));
                let mut t = lock(&conn_tasks);
                t.retain(|h| !h.is_finished());
                t.push(task);
            }
        });
        lock(&tasks).push(accept);
        Ok(Server { addr, tasks })
    }

    pub fn stop(&self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One connection, served in order (one request at a time, like a single I/O worker).
async fn serve_conn(stream: tokio::net::TcpStream, service: Service) {
    let (mut rd, wr) = stream.into_split();
    let mut wr = tokio::io::BufWriter::new(wr);
    let counters = match &service {
        Service::Tablet(t) => t.counters.clone(),
        Service::Shard(s) => s.counters.clone(),
        Service::Coordinator(c, _) => c.counters.clone(),
    };
    while let Ok(Some(body)) = proto::read_frame(&mut rd).await {
        let begun = Instant::now();
        let mut r = Reader::new(&body);
        let (Some(id), Some(kind)) = (r.u64(), r.u8()) else {
            return;
        };
        let payload = &body[9..];
        let answer = match (&service, kind) {
            (Service::Tablet(t), proto::WRITE) => Some(t.handle(payload)),
            (Service::Shard(s), proto::READ) => Some(s.handle(payload).await),
            (Service::Coordinator(c, me), proto::ADMIN | proto::METADATA) => {
                c.handle(*me, kind, payload).await
            }
            _ => Some((Status::BadRequest, Vec::new())),
        };
        let Some((status, out)) = answer else {
            counters.served(None, begun.elapsed());
            continue; // the response is lost
        };
        let sent = wr
            .write_all(&proto::response(id, status, &out))
            .await
            .is_ok()
            && wr.flush().await.is_ok();
        counters.served(Some(status), begun.elapsed());
        if !sent {
            return;
        }
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
