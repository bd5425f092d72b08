//! Cancellation on tokio (issue 13 item 5): a `Submit` dropped before its batch left withdraws
//! its operation, so the transport never sees it, and a batch left empty is never sent and
//! frees its turn for the shard's next batch. Paused time and a window of one batch per shard
//! make "before its batch left" deterministic: the first batch of each shard is in flight for
//! 10 ms (virtual), and everything submitted meanwhile is held back.

use core::future::Future;
use core::time::Duration;
use std::collections::BTreeSet;
use std::hash::RandomState;
use std::sync::{Arc, Mutex};

use throttle_sansio::sync::{BatchDriver, BatchOutcome, Submit, Transport};
use throttle_sansio::{BatcherConfig, WindowConfig};
use throttle_tokio::{Instant, TokioRuntime};

/// A batch as the server received it: the shard and the gets.
type Batch = (u8, Vec<u32>);

/// A server 10 ms away that answers each get `x` with `10 * x`; it records every batch it
/// receives, as the server would see them.
#[derive(Clone, Default)]
struct Server {
    seen: Arc<Mutex<Vec<Batch>>>,
}

impl Server {
    fn ops(&self) -> BTreeSet<u32> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .flat_map(|(_, ops)| ops.iter().copied())
            .collect()
    }

    fn batches(&self) -> Vec<Batch> {
        self.seen.lock().unwrap().clone()
    }
}

impl Transport<u8, u32> for Server {
    type Output = u32;
    type Error = std::io::Error;

    fn send(
        &self,
        shard: &u8,
        ops: Vec<u32>,
    ) -> impl Future<Output = BatchOutcome<u32, std::io::Error>> + Send + 'static {
        self.seen.lock().unwrap().push((*shard, ops.clone()));
        async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(ops.into_iter().map(|x| Ok(10 * x)).collect())
        }
    }
}

type Driver = BatchDriver<TokioRuntime, Server, u8, u32, RandomState>;

fn driver(server: &Server) -> Driver {
    let cfg = BatcherConfig::reads()
        .with_window(WindowConfig::default().with_max_in_flight(1))
        .unwrap();
    BatchDriver::new(TokioRuntime::new(), server.clone(), cfg)
}

/// `future`'s output, or a failure once it is still pending after a minute of (paused) time:
/// a stranded operation or credit shows as a hang, which this turns into a failed test.
async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("stranded: still pending after 60 s")
}

/// Lets the driver task take everything submitted (no time passes: it is paused and nothing
/// sleeps yet).
async fn settle(driver: &Driver) {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(driver.queued(), 0, "the driver task took every submit");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn of_4000_gets_the_400_dropped_before_their_batch_left_never_reach_the_server() {
    let server = Server::default();
    let driver = driver(&server);
    let shard = |op: u32| (op % 4) as u8;
    let mut kept: Vec<(u32, Submit<u32, std::io::Error>)> = Vec::new();
    // 1000 gets go out at once: one batch of 250 per shard, in flight for 10 ms.
    for op in 0..1000 {
        kept.push((op, driver.submit(shard(op), op)));
    }
    settle(&driver).await;
    assert_eq!(server.ops().len(), 1000);
    // 2600 more are parked behind them; their callers give up on 200 of them.
    let mut dropped = BTreeSet::new();
    let mut later = Vec::new();
    for op in 1000..3600 {
        later.push((op, driver.submit(shard(op), op)));
    }
    settle(&driver).await;
    assert_eq!((0..4).map(|s| driver.open_ops(&s)).sum::<usize>(), 2600);
    for (op, submit) in later {
        if op % 13 == 0 && dropped.len() < 200 {
            dropped.insert(op);
            drop(submit);
        } else {
            kept.push((op, submit));
        }
    }
    assert_eq!((0..4).map(|s| driver.open_ops(&s)).sum::<usize>(), 2400);
    // The last 400 are still in the driver's input queue when 200 of their callers give up.
    for op in 3600..4000 {
        let submit = driver.submit(shard(op), op);
        if op % 2 == 0 {
            dropped.insert(op);
            drop(submit);
        } else {
            kept.push((op, submit));
        }
    }
    assert_eq!(
        (dropped.len(), kept.len(), driver.queued()),
        (400, 3600, 200)
    );
    for (op, submit) in kept {
        assert_eq!(within(submit).await.unwrap(), 10 * op, "op {op}");
    }
    let want: BTreeSet<u32> = (0..4000).filter(|op| !dropped.contains(op)).collect();
    assert_eq!(
        server.ops(),
        want,
        "the server received exactly the 3600 not dropped"
    );
    assert_eq!(
        server.batches().iter().map(|b| b.1.len()).sum::<usize>(),
        3600,
        "each once"
    );
    driver.close();
    within(driver.closed()).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_emptied_batch_is_never_sent_and_the_shard_s_next_batch_goes_out_at_once() {
    let server = Server::default();
    let driver = driver(&server);
    let rt = TokioRuntime::new();
    let first = driver.submit(0, 1); // in flight from 0 to 10 ms
    settle(&driver).await;
    let (a, b) = (driver.submit(0, 2), driver.submit(0, 3));
    settle(&driver).await;
    assert_eq!(driver.open_ops(&0), 2, "parked behind the first batch");
    drop((a, b));
    assert_eq!(driver.open_ops(&0), 0, "withdrawn");
    assert_eq!(within(first).await.unwrap(), 10);
    let started = rt.now();
    assert_eq!(
        driver.in_flight(&0),
        0,
        "the emptied batch took no credit when the first one ended"
    );
    assert_eq!(within(driver.submit(0, 4)).await.unwrap(), 40);
    assert_eq!(
        rt.now(),
        started + Duration::from_millis(10),
        "the next get went out at once, not behind a ghost batch"
    );
    assert_eq!(server.batches(), [(0, vec![1]), (0, vec![4])]);
    assert!(rt.now() < Instant::from_millis(30));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_submit_dropped_after_its_batch_left_still_goes_out_and_strands_nothing() {
    let server = Server::default();
    let driver = driver(&server);
    drop(driver.submit(0, 1)); // still in the input queue: withdrawn
    let sent = driver.submit(0, 2);
    settle(&driver).await;
    drop(sent); // in flight: too late, its result is discarded
    let next = driver.submit(0, 3); // parked behind it, then sent when it ends
    assert_eq!(within(next).await.unwrap(), 30);
    assert_eq!(server.batches(), [(0, vec![2]), (0, vec![3])]);
    assert_eq!(driver.in_flight(&0), 0);
    driver.close();
    within(driver.closed()).await;
}
