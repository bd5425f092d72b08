//! Graceful shutdown on tokio (issue 13 item 5): `close()` stops intake and fails what is held
//! back with a closed error at once, and `closed().await` resolves only when everything in
//! flight at the close has ended: the batches in the transport for `BatchDriver`, the leases
//! and connects for `ConnPool`. Paused time makes "at once" and "when it ended" exact instants.

use core::future::Future;
use core::time::Duration;
use std::hash::RandomState;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use throttle_sansio::conn_key::{ConnConfig, ConnKey};
use throttle_sansio::sync::{
    BatchDriver, BatchOutcome, ConnPool, Connector, OpError, PoolError, Transport,
};
use throttle_sansio::{BatcherConfig, WindowConfig};
use throttle_tokio::{Instant, TokioRuntime};

const MS: Duration = Duration::from_millis(1);

/// `future`'s output, or a failure once it is still pending after a minute of (paused) time.
async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("stranded: still pending after 60 s")
}

/// Whether `future` is still pending after everything runnable has run (no time passes).
async fn pending_now<F: Future + Unpin>(future: &mut F) -> bool {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    std::pin::Pin::new(future).poll(&mut cx).is_pending()
}

/// Answers each get `x` with `x` after 10 ms.
struct Slow;

impl Transport<u8, u32> for Slow {
    type Output = u32;
    type Error = std::io::Error;

    // Not an `async fn`: that would borrow `self`, and the future must be `'static`.
    #[allow(clippy::manual_async_fn)]
    fn send(
        &self,
        _shard: &u8,
        ops: Vec<u32>,
    ) -> impl Future<Output = BatchOutcome<u32, std::io::Error>> + Send + 'static {
        async move {
            tokio::time::sleep(10 * MS).await;
            Ok(ops.into_iter().map(Ok).collect())
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn driver_close_fails_held_back_work_at_once_and_closed_waits_for_the_batch_in_flight() {
    let rt = TokioRuntime::new();
    let cfg = BatcherConfig::reads()
        .with_window(WindowConfig::default().with_max_in_flight(1))
        .unwrap();
    let driver: BatchDriver<_, _, u8, u32, RandomState> = BatchDriver::new(rt.clone(), Slow, cfg);
    let in_flight = tokio::spawn(driver.submit(0, 1));
    tokio::task::yield_now().await;
    assert_eq!(driver.in_flight(&0), 1);
    let parked = driver.submit(0, 2);
    tokio::task::yield_now().await;
    assert_eq!(driver.open_ops(&0), 1);
    let queued = driver.submit(0, 3); // still in the driver's input queue
    driver.close();
    assert!(matches!(within(parked).await, Err(OpError::Closed)));
    assert!(matches!(within(queued).await, Err(OpError::Closed)));
    assert!(matches!(driver.submit(1, 4).await, Err(OpError::Closed)));
    assert_eq!(rt.now(), Instant::ZERO, "held-back work failed at once");
    let mut closed = Box::pin(driver.closed());
    assert!(
        pending_now(&mut closed).await,
        "closed() waits for the batch in flight"
    );
    within(closed).await;
    assert_eq!(rt.now(), Instant::ZERO + 10 * MS, "when that batch ended");
    assert_eq!(
        in_flight.await.unwrap().unwrap(),
        1,
        "and it finished normally"
    );
    assert_eq!(driver.in_flight(&0), 0);
}

/// Connects after 10 ms; counts live connections.
#[derive(Clone, Default)]
struct Dialer {
    live: Arc<AtomicUsize>,
}

struct Conn(Arc<AtomicUsize>);

impl Drop for Conn {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Connector<u32> for Dialer {
    type Conn = Conn;
    type Error = std::io::Error;

    fn connect(
        &self,
        _host: &u32,
        _port: u16,
        _attempt: throttle_sansio::conn_key::ConnectAttempt,
    ) -> impl Future<Output = Result<Conn, std::io::Error>> + Send + 'static {
        let live = Arc::clone(&self.live);
        async move {
            tokio::time::sleep(10 * MS).await;
            live.fetch_add(1, Ordering::SeqCst);
            Ok(Conn(live))
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn pool_close_fails_waiting_leases_at_once_and_closed_waits_for_leases_and_connects() {
    let rt = TokioRuntime::new();
    let dialer = Dialer::default();
    let pool: ConnPool<_, _, u32, u32, RandomState> =
        ConnPool::new(rt.clone(), dialer.clone(), ConnConfig::default()).unwrap();
    let (one, two) = (ConnKey::new(1, 1, 1), ConnKey::new(2, 2, 2));
    let held = within(pool.lease(&one)).await.unwrap(); // connected at 10 ms
    let start = rt.now();
    let (p, q) = (pool.clone(), pool.clone());
    let opener = tokio::spawn(async move { p.lease(&ConnKey::new(2, 2, 2)).await.map(drop) });
    tokio::task::yield_now().await; // its connect is running
    let waiter = tokio::spawn(async move { q.lease(&ConnKey::new(2, 2, 2)).await.map(drop) });
    tokio::task::yield_now().await; // waiting for that connect
    pool.close();
    assert!(matches!(
        within(waiter).await.unwrap(),
        Err(PoolError::Closed)
    ));
    assert!(matches!(pool.lease(&two).await, Err(PoolError::Closed)));
    assert_eq!(rt.now(), start, "the waiting lease failed at once");
    let mut closed = Box::pin(pool.closed());
    assert!(
        pending_now(&mut closed).await,
        "closed() waits for the lease still held"
    );
    drop(held);
    assert!(
        pending_now(&mut closed).await,
        "and for the connect still running"
    );
    assert_eq!(
        dialer.live.load(Ordering::SeqCst),
        0,
        "the held lease's connection is gone"
    );
    within(closed).await;
    assert_eq!(
        rt.now(),
        start + 10 * MS,
        "closed() resolved when the connect ended"
    );
    assert_eq!(
        dialer.live.load(Ordering::SeqCst),
        0,
        "the late connection was dropped: none open after closed()"
    );
    assert!(matches!(
        within(opener).await.unwrap(),
        Err(PoolError::Closed)
    ));
}
