//! `SendOrder::PerShard` on tokio (issue 14 item 4): each shard's batches reach the transport
//! in dispatch order, under a window of several credits and many concurrent submitters, on a
//! runtime that runs spawned tasks in a scrambled order (as a multi-threaded one may); the
//! concurrent mode, on the same runtime and load, reorders them. Also the panic and drop
//! cases of the ordered mode: nothing stranded, the shard's later batches still go, in order.
//!
//! "Reaches the transport" is observed twice: the order of the `send` calls, and the order in
//! which the send futures are first polled (where an `async` transport writes its request).
//! Paused time: the server's answer delays are virtual, so every run is the same.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use core::time::Duration;
use std::collections::BTreeMap;
use std::hash::RandomState;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use throttle_sansio::sync::{BatchDriver, BatchOutcome, OpError, Runtime, SendOrder, Transport};
use throttle_sansio::{BatcherConfig, Instant, WindowConfig};
use throttle_tokio::TokioRuntime;

/// A small deterministic generator (splitmix64) for the scenario's choices.
#[derive(Clone)]
struct Draws(Arc<AtomicU64>);

impl Draws {
    fn new(seed: u64) -> Self {
        Draws(Arc::new(AtomicU64::new(seed)))
    }

    /// A draw in `0..n`.
    fn below(&self, n: u64) -> u64 {
        let mut z = self
            .0
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

/// Tokio, except that each spawned task first yields a drawn number of times (0 to 3): tasks
/// start in a scrambled order, as on a multi-threaded runtime (where two workers, or a
/// worker's LIFO slot, can start the later of two spawned tasks first). The `Runtime`
/// contract promises no order between tasks.
#[derive(Clone)]
struct Scrambled {
    tokio: TokioRuntime,
    draws: Draws,
}

impl Runtime for Scrambled {
    fn now(&self) -> Instant {
        self.tokio.now()
    }

    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
        self.tokio.sleep_until(deadline)
    }

    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
        let yields = self.draws.below(4);
        self.tokio.spawn(async move {
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            future.await;
        });
    }
}

/// What the server saw of one shard.
#[derive(Clone, Debug, Default)]
struct ShardLog {
    /// Each batch's operations, in the order `send` was called for it.
    sent: Vec<Vec<u64>>,
    /// Each batch's operations, in the order its future was first polled.
    polled: Vec<Vec<u64>>,
    /// Batches in flight now, and the most ever at once.
    in_flight: usize,
    peak: usize,
}

type Logs = Arc<Mutex<BTreeMap<u8, ShardLog>>>;

/// A server that answers each operation with itself after a drawn delay of 1 to 8 ms (so
/// answers come back out of order); the future panics on a batch holding [`FUTURE_PANIC`],
/// `send` on one holding [`SEND_PANIC`], and a batch holding [`NEVER`] is never answered.
#[derive(Clone)]
struct Server {
    logs: Logs,
    draws: Draws,
}

const SEND_PANIC: u64 = u64::MAX - 1;
const FUTURE_PANIC: u64 = u64::MAX - 2;
const NEVER: u64 = u64::MAX - 3;

impl Server {
    fn new(seed: u64) -> Self {
        Server {
            logs: Arc::default(),
            draws: Draws::new(seed ^ 0x5EED),
        }
    }

    fn log(&self, shard: u8) -> ShardLog {
        self.logs
            .lock()
            .unwrap()
            .get(&shard)
            .cloned()
            .unwrap_or_default()
    }
}

/// Runs `f` on the first poll only, then polls `inner`.
struct FirstPoll<F, Fut> {
    first: Option<F>,
    inner: Pin<Box<Fut>>,
}

impl<F: FnOnce() + Unpin, Fut: Future> Future for FirstPoll<F, Fut> {
    type Output = Fut::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Fut::Output> {
        if let Some(f) = self.first.take() {
            f();
        }
        self.inner.as_mut().poll(cx)
    }
}

impl Transport<u8, u64> for Server {
    type Output = u64;
    type Error = std::io::Error;

    fn send(
        &self,
        shard: &u8,
        ops: Vec<u64>,
    ) -> impl Future<Output = BatchOutcome<u64, std::io::Error>> + Send + 'static {
        let shard = *shard;
        self.logs
            .lock()
            .unwrap()
            .entry(shard)
            .or_default()
            .sent
            .push(ops.clone());
        assert!(!ops.contains(&SEND_PANIC), "send panics");
        let delay = Duration::from_millis(1 + self.draws.below(8));
        let (logs, seen) = (Arc::clone(&self.logs), ops.clone());
        let first = move || {
            let mut logs = logs.lock().unwrap();
            let log = logs.entry(shard).or_default();
            log.polled.push(seen);
            log.in_flight += 1;
            log.peak = log.peak.max(log.in_flight);
        };
        let logs = Arc::clone(&self.logs);
        let inner = async move {
            if ops.contains(&NEVER) {
                core::future::pending::<()>().await;
            }
            tokio::time::sleep(delay).await;
            logs.lock().unwrap().entry(shard).or_default().in_flight -= 1;
            assert!(!ops.contains(&FUTURE_PANIC), "the send future panics");
            Ok(ops.into_iter().map(Ok).collect())
        };
        FirstPoll {
            first: Some(first),
            inner: Box::pin(inner),
        }
    }
}

type Driver = BatchDriver<Scrambled, Server, u8, u64, RandomState>;

const SHARDS: u8 = 3;
const SUBMITTERS: u64 = 8;
const ROUNDS: u64 = 12;

/// A driver of `order` with four credits per shard and batches of at most three operations
/// (so a submitter's burst to one shard spans several batches in flight at once).
fn driver(order: SendOrder, server: &Server, seed: u64) -> Driver {
    let rt = Scrambled {
        tokio: TokioRuntime::new(),
        draws: Draws::new(seed),
    };
    let cfg = BatcherConfig::writes()
        .with_max_requests_per_batch(NonZeroUsize::new(3).expect("not zero"))
        .with_window(WindowConfig::default().with_max_in_flight(4))
        .expect("a window above 0 is valid");
    BatchDriver::builder(rt, server.clone(), cfg)
        .with_send_order(order)
        .build()
}

/// `future`'s output, or a failure after a minute of (paused) time: a stranded credit shows
/// as a hang, which this turns into a failed test.
async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("stranded: still pending after 60 s")
}

/// Eight submitter tasks, each in twelve rounds bursting one to five operations at one
/// drawn shard (submitted without waiting), then awaiting them and pausing 0 to 2 ms. Every
/// operation is numbered when it is submitted, from one counter: on this one thread the
/// numbers are the order of the `submit` calls, so each shard's operations must reach the
/// server in increasing numbers if its batches keep dispatch order. Returns the logs by shard.
async fn scenario(order: SendOrder, seed: u64) -> BTreeMap<u8, ShardLog> {
    let server = Server::new(seed);
    let driver = driver(order, &server, seed);
    let next = Arc::new(AtomicU64::new(0));
    let mut submitters = Vec::new();
    for s in 0..SUBMITTERS {
        let (driver, next) = (driver.clone(), Arc::clone(&next));
        let draws = Draws::new(seed.wrapping_mul(31).wrapping_add(s));
        submitters.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let shard = u8::try_from(draws.below(u64::from(SHARDS))).unwrap();
                let burst: Vec<_> = (0..1 + draws.below(5))
                    .map(|_| {
                        let op = next.fetch_add(1, Ordering::SeqCst);
                        (op, driver.submit(shard, op))
                    })
                    .collect();
                for (op, result) in burst {
                    assert_eq!(result.await.unwrap(), op, "answered with itself");
                }
                tokio::time::sleep(Duration::from_millis(draws.below(3))).await;
            }
        }));
    }
    for s in submitters {
        within(s).await.unwrap();
    }
    for shard in 0..SHARDS {
        assert_eq!(
            driver.in_flight(&shard),
            0,
            "shard {shard}: a credit left live"
        );
    }
    driver.close();
    within(driver.closed()).await;
    let logs = server.logs.lock().unwrap().clone();
    let total: usize = logs.values().map(|l| l.sent.iter().flatten().count()).sum();
    assert_eq!(
        total as u64,
        next.load(Ordering::SeqCst),
        "every operation sent once"
    );
    logs
}

/// Whether the operations, batch after batch, are in increasing numbers.
fn increasing(batches: &[Vec<u64>]) -> bool {
    let ops: Vec<u64> = batches.iter().flatten().copied().collect();
    ops.windows(2).all(|w| w[0] < w[1])
}

const SEEDS: [u64; 4] = [1, 2, 3, 4];

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn per_shard_mode_never_reorders_a_shard_s_batches_under_many_submitters() {
    for seed in SEEDS {
        let logs = scenario(SendOrder::PerShard, seed).await;
        assert_eq!(
            logs.len(),
            usize::from(SHARDS),
            "seed {seed}: every shard used"
        );
        for (shard, log) in &logs {
            assert!(
                increasing(&log.sent),
                "seed {seed}, shard {shard}: send called out of dispatch order: {:?}",
                log.sent
            );
            assert_eq!(
                log.polled, log.sent,
                "seed {seed}, shard {shard}: futures first polled out of dispatch order"
            );
            // Not one batch at a time: the window pipelined, so order was at stake.
            assert!(log.peak >= 2, "seed {seed}, shard {shard}: never pipelined");
            assert!(
                log.sent.len() >= 10,
                "seed {seed}, shard {shard}: few batches"
            );
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn concurrent_mode_can_reorder_a_shard_s_batches_under_the_same_load() {
    let mut reordered = 0;
    for seed in SEEDS {
        let logs = scenario(SendOrder::Concurrent, seed).await;
        for log in logs.values() {
            // One thread: `send` is still called in dispatch order...
            assert!(increasing(&log.sent), "seed {seed}: {:?}", log.sent);
            // ...but each future is polled by a task of its own, which the runtime starts
            // when it likes.
            if !increasing(&log.polled) {
                reordered += 1;
            }
        }
    }
    assert!(
        reordered >= SEEDS.len(),
        "only {reordered} shard runs reordered: the ordered test would prove nothing"
    );
}

/// A per-shard driver with one operation per batch and four credits, on plain tokio.
fn single_op_batches(server: &Server) -> BatchDriver<TokioRuntime, Server, u8, u64, RandomState> {
    let cfg = BatcherConfig::writes()
        .with_max_requests_per_batch(NonZeroUsize::MIN)
        .with_window(WindowConfig::default().with_max_in_flight(4))
        .expect("a window above 0 is valid");
    BatchDriver::builder(TokioRuntime::new(), server.clone(), cfg)
        .with_send_order(SendOrder::PerShard)
        .build()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn per_shard_mode_a_panicking_send_or_future_fails_its_batch_and_later_batches_go_in_order() {
    for poison in [SEND_PANIC, FUTURE_PANIC] {
        let server = Server::new(7);
        let driver = single_op_batches(&server);
        // Eight batches of one operation each, the third poisoned: four in flight at once,
        // the rest queued behind them and sent as credits return.
        let ops = [1, 2, poison, 4, 5, 6, 7, 8];
        let results: Vec<_> = ops.iter().map(|&op| driver.submit(1, op)).collect();
        for (op, result) in ops.into_iter().zip(results) {
            let result = within(result).await;
            if op == poison {
                assert!(
                    matches!(result, Err(OpError::Panicked(_))),
                    "{poison}: {result:?}"
                );
            } else {
                assert_eq!(result.unwrap(), op, "{poison}: op {op}");
            }
        }
        assert_eq!(driver.in_flight(&1), 0, "{poison}: the credit came back");
        let log = server.log(1);
        let sent: Vec<u64> = log.sent.iter().flatten().copied().collect();
        assert_eq!(sent, ops, "{poison}: every batch sent, in order");
        let polled: Vec<u64> = log.polled.iter().flatten().copied().collect();
        let expected: Vec<u64> = ops.iter().copied().filter(|&op| op != SEND_PANIC).collect();
        assert_eq!(polled, expected, "{poison}: polled in order");
        assert!(log.peak >= 2, "{poison}: pipelined");
        // The shard keeps serving.
        assert_eq!(within(driver.submit(1, 9)).await.unwrap(), 9);
        driver.close();
        within(driver.closed()).await;
    }
}

#[test]
fn per_shard_mode_a_runtime_dropped_mid_flight_releases_every_credit() {
    let server = Server::new(9);
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let driver = tokio_rt.block_on(async { single_op_batches(&server) });
    // Shard 1: four batches in flight that the server never answers, two more held back in
    // the window behind them; shard 2: one answered batch, then one never answered.
    let stuck: Vec<_> = (0..6).map(|_| driver.submit(1, NEVER)).collect();
    let answered = driver.submit(2, 5);
    let last = driver.submit(2, NEVER);
    tokio_rt.block_on(async {
        assert_eq!(within(answered).await.unwrap(), 5);
        while server.log(1).polled.len() < 4 || server.log(2).polled.len() < 2 {
            tokio::task::yield_now().await;
        }
    });
    assert_eq!((driver.in_flight(&1), driver.open_ops(&1)), (4, 0));
    assert_eq!(driver.in_flight(&2), 1);
    // The runtime shuts down: the driver task and both lane tasks are dropped.
    drop(tokio_rt);
    for shard in [1, 2] {
        assert_eq!(
            driver.in_flight(&shard),
            0,
            "shard {shard}: a credit stranded"
        );
        assert_eq!(
            driver.open_ops(&shard),
            0,
            "shard {shard}: an operation left"
        );
    }
    assert_eq!(
        server.log(1).sent.len(),
        4,
        "nothing sent from a destructor"
    );
    let after = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    after.block_on(async {
        for (i, s) in stuck.into_iter().chain([last]).enumerate() {
            let r = s.await;
            assert!(matches!(r, Err(OpError::NoResponse)), "op {i}: {r:?}");
        }
    });
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn per_shard_mode_a_dropped_driver_handle_still_answers_what_it_sent() {
    let server = Server::new(11);
    let driver = single_op_batches(&server);
    let results: Vec<_> = (1..=6).map(|op| driver.submit(1, op)).collect();
    drop(driver); // its tasks keep their own handles until the batches end
    for (op, r) in (1..=6).zip(results) {
        assert_eq!(within(r).await.unwrap(), op);
    }
    let sent: Vec<u64> = server.log(1).sent.iter().flatten().copied().collect();
    assert_eq!(sent, [1, 2, 3, 4, 5, 6]);
}
