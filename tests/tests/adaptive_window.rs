//! The batch driver with a limiter per shard (issue 18 item 3): the limiter's limit drives the
//! shard's window, so a server that drops batches beyond its capacity is sent fewer at once,
//! while a driver without a limiter keeps its configured window (the default).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use core::time::Duration;
use std::hash::RandomState;
use std::sync::Arc;

use throttle_tokio::limiter::{AimdConfig, LimiterConfig};
use throttle_tokio::sync::{BatchDriver, BatchOutcome, OpError, Transport};
use throttle_tokio::{BatcherConfig, TokioRuntime, WindowConfig};

/// A shard server that runs at most `capacity` batches at once, 2 ms each, and drops (fails
/// at once) a batch that arrives while it is full.
#[derive(Clone)]
struct Server {
    capacity: u32,
    busy: Arc<AtomicU32>,
    /// Batches in the transport (served or being dropped) at once, at most.
    peak: Arc<AtomicU32>,
    sending: Arc<AtomicU32>,
    dropped: Arc<AtomicU64>,
    served: Arc<AtomicU64>,
}

impl Server {
    fn new(capacity: u32) -> Self {
        Server {
            capacity,
            busy: Arc::default(),
            peak: Arc::default(),
            sending: Arc::default(),
            dropped: Arc::default(),
            served: Arc::default(),
        }
    }
}

impl Transport<u8, u32> for Server {
    type Output = u32;
    type Error = &'static str;

    fn send(
        &self,
        _: &u8,
        ops: Vec<u32>,
    ) -> impl Future<Output = BatchOutcome<u32, &'static str>> + Send + 'static {
        let s = self.clone();
        async move {
            let sending = s.sending.fetch_add(1, Ordering::SeqCst) + 1;
            s.peak.fetch_max(sending, Ordering::SeqCst);
            let now = s.busy.fetch_add(1, Ordering::SeqCst) + 1;
            if now > s.capacity {
                s.busy.fetch_sub(1, Ordering::SeqCst);
                s.dropped.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200)).await;
                s.sending.fetch_sub(1, Ordering::SeqCst);
                return Err("overloaded");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            s.busy.fetch_sub(1, Ordering::SeqCst);
            s.sending.fetch_sub(1, Ordering::SeqCst);
            s.served.fetch_add(1, Ordering::SeqCst);
            Ok(ops.into_iter().map(Ok).collect())
        }
    }
}

/// 64 submitters, each a closed loop of single reads on shard 1 that retries a failed one,
/// until `total` reads succeeded; returns the driver's window limit for shard 1 at the end.
async fn run(driver: BatchDriver<TokioRuntime, Server, u8, u32, RandomState>, total: u64) -> u32 {
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..64u32 {
        let (d, done) = (driver.clone(), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            while done.load(Ordering::SeqCst) < total {
                match d.submit(1, i).await {
                    Ok(v) => {
                        assert_eq!(v, i);
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(OpError::Batch(_)) => {}
                    Err(e) => panic!("unexpected {e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("submitter");
    }
    let limit = driver.capacity_of(&1);
    driver.close();
    driver.closed().await;
    limit
}

fn config() -> BatcherConfig {
    // One read per batch, so each read is one sample; a configured window of 16 batches.
    BatcherConfig::reads()
        .with_max_requests_per_batch(core::num::NonZeroUsize::MIN)
        .with_window(WindowConfig::default().with_max_in_flight(16))
        .expect("valid window")
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_per_shard_limiter_shrinks_the_window_to_what_the_server_serves() {
    let rt = TokioRuntime::new();
    let fixed = Server::new(4);
    let driver = BatchDriver::new(rt.clone(), fixed.clone(), config());
    assert_eq!(
        run(driver, 4_000).await,
        16,
        "no limiter: the configured window stays"
    );
    let aimd = LimiterConfig::aimd(AimdConfig::default().with_limits(1, 16, 64));
    let adaptive = Server::new(4);
    let driver = BatchDriver::builder(rt.clone(), adaptive.clone(), config())
        .with_limiter(aimd)
        .expect("valid limiter")
        .build();
    let limit = run(driver, 4_000).await;
    let (fixed_drops, adaptive_drops) = (
        fixed.dropped.load(Ordering::SeqCst),
        adaptive.dropped.load(Ordering::SeqCst),
    );
    assert!(
        (1..=8).contains(&limit),
        "the limiter's window settled near the server's 4 at {limit}"
    );
    assert!(
        // Measured: 24,043 against 4,037. AIMD probes one above the server's 4 after each
        // answered batch and backs off at the drop, so about one drop per read remains.
        fixed_drops >= 4_000 && adaptive_drops * 4 <= fixed_drops,
        "drops: fixed window {fixed_drops}, adaptive {adaptive_drops}"
    );
    assert_eq!(
        fixed.peak.load(Ordering::SeqCst),
        16,
        "the fixed window fills"
    );
    assert!(adaptive.peak.load(Ordering::SeqCst) <= 16);
    assert!(adaptive.served.load(Ordering::SeqCst) >= 4_000);
}
