//! The draining close of `BatchDriver` on tokio (issue 14 item 4): `drain()` refuses later
//! submits at once but sends everything already submitted, queued, open or parked, keeping
//! batch boundaries and each shard's order, and resolves when the last of it has ended.
//! Paused time makes "when it ended" an exact instant.

use core::future::Future;
use core::num::NonZeroUsize;
use core::time::Duration;
use std::hash::RandomState;
use std::sync::{Arc, Mutex};

use throttle_sansio::sync::{BatchDriver, BatchOutcome, OpError, SendOrder, Submit, Transport};
use throttle_sansio::{BatcherConfig, WindowConfig};
use throttle_tokio::{Instant, TokioRuntime};

const MS: Duration = Duration::from_millis(1);

/// `future`'s output, or a failure once it is still pending after a minute of (paused) time.
async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("stranded: still pending after 60 s")
}

/// Records each batch as the server sees it, and answers each get `x` with `10 x` after 10 ms.
#[derive(Clone, Default)]
struct Server(Arc<Mutex<Vec<Seen>>>);

/// A batch as the server saw it: its shard and its gets.
type Seen = (u8, Vec<u32>);

impl Transport<u8, u32> for Server {
    type Output = u32;
    type Error = std::io::Error;

    // Not an `async fn`: that would borrow `self`, and the future must be `'static`.
    #[allow(clippy::manual_async_fn)]
    fn send(
        &self,
        shard: &u8,
        ops: Vec<u32>,
    ) -> impl Future<Output = BatchOutcome<u32, std::io::Error>> + Send + 'static {
        self.0.lock().unwrap().push((*shard, ops.clone()));
        async move {
            tokio::time::sleep(10 * MS).await;
            Ok(ops.into_iter().map(|x| Ok(10 * x)).collect())
        }
    }
}

type Driver = BatchDriver<TokioRuntime, Server, u8, u32, RandomState>;

/// One batch in flight per shard, three gets per batch.
fn driver(rt: &TokioRuntime, server: &Server) -> Driver {
    let cfg = BatcherConfig::reads()
        .with_max_requests_per_batch(NonZeroUsize::new(3).unwrap())
        .with_window(WindowConfig::default().with_max_in_flight(1))
        .unwrap();
    BatchDriver::new(rt.clone(), server.clone(), cfg)
}

/// Shard 0: `[1]` in flight, then 2..=6 and shard 1's 7 still in the driver's input queue.
async fn load(driver: &Driver) -> Vec<(u32, Submit<u32, std::io::Error>)> {
    let mut subs = vec![(1, driver.submit(0, 1))];
    tokio::task::yield_now().await; // the driver task sends [1]
    assert_eq!(driver.in_flight(&0), 1);
    subs.extend((2..=6).map(|x| (x, driver.submit(0, x))));
    subs.push((7, driver.submit(1, 7)));
    assert_eq!(driver.queued(), 6, "not yet handed to the batcher");
    subs
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn drain_sends_everything_accepted_in_order_and_refuses_later_submits() {
    let (rt, server) = (TokioRuntime::new(), Server::default());
    let driver = driver(&rt, &server);
    let subs = load(&driver).await;
    let drained = driver.drain();
    assert!(driver.is_closed());
    assert!(
        matches!(driver.submit(0, 8).await, Err(OpError::Closed)),
        "a submit after drain is refused"
    );
    within(drained).await;
    assert_eq!(
        rt.now(),
        Instant::ZERO + 30 * MS,
        "shard 0's three batches, one after another"
    );
    for (x, sub) in subs {
        match sub.await {
            Ok(v) => assert_eq!(v, 10 * x, "get {x}"),
            Err(e) => panic!("get {x} failed: {e:?}"),
        }
    }
    let mut seen = server.0.lock().unwrap().clone();
    seen.sort_by_key(|(shard, _)| *shard); // stable: each shard's batches stay in order
    assert_eq!(
        seen,
        [
            (0, vec![1]),
            (0, vec![2, 3, 4]),
            (0, vec![5, 6]),
            (1, vec![7])
        ],
        "batch boundaries and arrival order kept; 8 never sent"
    );
    within(driver.drain()).await; // idempotent: already drained
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn close_after_drain_fails_what_is_still_held_back() {
    let (rt, server) = (TokioRuntime::new(), Server::default());
    let driver = driver(&rt, &server);
    let subs = load(&driver).await;
    let drained = driver.drain();
    driver.close(); // the failing close wins for what has not left yet
    within(drained).await;
    assert_eq!(rt.now(), Instant::ZERO + 10 * MS);
    let mut ended = Vec::new();
    for (x, sub) in subs {
        ended.push((x, sub.await.map_err(|e| matches!(e, OpError::Closed))));
    }
    assert_eq!(
        ended,
        [
            (1, Ok(10)),
            (2, Err(true)),
            (3, Err(true)),
            (4, Err(true)),
            (5, Err(true)),
            (6, Err(true)),
            (7, Ok(70))
        ],
        "sent batches finish normally, held-back ones fail Closed"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn drain_in_per_shard_mode_sends_through_the_lanes_in_dispatch_order() {
    let (rt, server) = (TokioRuntime::new(), Server::default());
    let cfg = BatcherConfig::reads()
        .with_max_requests_per_batch(NonZeroUsize::MIN)
        .with_window(WindowConfig::default().with_max_in_flight(2))
        .unwrap();
    let driver: Driver = BatchDriver::builder(rt.clone(), server.clone(), cfg)
        .with_send_order(SendOrder::PerShard)
        .build();
    // All still in the input queue: the driver task has not run.
    let subs: Vec<_> = (1..=6)
        .map(|x| (x, driver.submit(0, x)))
        .chain([(7, driver.submit(1, 7))])
        .collect();
    let drained = driver.drain();
    assert!(
        server.0.lock().unwrap().is_empty(),
        "per shard, `send` runs in the lane tasks, not in the draining call"
    );
    within(drained).await;
    assert_eq!(
        rt.now(),
        Instant::ZERO + 30 * MS,
        "shard 0's six batches, two at a time"
    );
    for (x, sub) in subs {
        assert_eq!(sub.await.unwrap(), 10 * x, "get {x}");
    }
    let seen = server.0.lock().unwrap().clone();
    let shard0: Vec<Vec<u32>> = seen
        .into_iter()
        .filter_map(|(shard, gets)| (shard == 0).then_some(gets))
        .collect();
    let each: Vec<Vec<u32>> = (1..=6).map(|x| vec![x]).collect();
    assert_eq!(shard0, each, "shard 0's batches sent in submission order");
    assert!(matches!(driver.submit(0, 8).await, Err(OpError::Closed)));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn close_after_drain_in_per_shard_mode_still_sends_what_reached_a_lane() {
    let (rt, server) = (TokioRuntime::new(), Server::default());
    let cfg = BatcherConfig::reads()
        .with_max_requests_per_batch(NonZeroUsize::MIN)
        .with_window(WindowConfig::default().with_max_in_flight(2))
        .unwrap();
    let driver: Driver = BatchDriver::builder(rt.clone(), server.clone(), cfg)
        .with_send_order(SendOrder::PerShard)
        .build();
    let subs: Vec<_> = (1..=4).map(|x| (x, driver.submit(0, x))).collect();
    let drained = driver.drain(); // [1] and [2] take the credits, into the lane; [3], [4] wait
    driver.close(); // before the lane task ran: it fails only what is held back
    within(drained).await;
    let mut ended = Vec::new();
    for (x, sub) in subs {
        ended.push((x, sub.await.map_err(|e| matches!(e, OpError::Closed))));
    }
    assert_eq!(
        ended,
        [(1, Ok(10)), (2, Ok(20)), (3, Err(true)), (4, Err(true))],
        "dispatched batches are sent by the lane, held-back ones fail Closed"
    );
    assert_eq!(*server.0.lock().unwrap(), [(0, vec![1]), (0, vec![2])]);
    assert_eq!(rt.now(), Instant::ZERO + 10 * MS);
}
