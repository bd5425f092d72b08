//! The drivers on tokio when user code panics: a transport, a connector, a classifier or a
//! refresh that panics fails its own operation with `Panicked` and strands nothing, so later
//! callers of the same driver proceed. Also the documented panic of a driver built outside a
//! tokio runtime.

use core::future::Future;
use core::time::Duration;
use std::hash::RandomState;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use throttle_sansio::conn_key::{ConnConfig, ConnKey};
use throttle_sansio::failover::{AdminWriteGateway, CallConfig, ErrorKind, Unlimited};
use throttle_sansio::sync::{
    BatchDriver, BatchOutcome, CallError, ConnPool, Connector, FailoverExecutor, OpError, Panicked,
    PoolError, Transport,
};
use throttle_sansio::{BatcherConfig, WindowConfig};
use throttle_tokio::TokioRuntime;

/// Answers each operation with itself, after a yield; the future panics on a batch holding
/// operation 13, `send` itself on one holding 14.
#[derive(Clone, Default)]
struct Echo {
    sends: Arc<AtomicUsize>,
}

impl Transport<u8, u32> for Echo {
    type Output = u32;
    type Error = &'static str;

    fn send(
        &self,
        _shard: &u8,
        ops: Vec<u32>,
    ) -> impl Future<Output = BatchOutcome<u32, &'static str>> + Send + 'static {
        self.sends.fetch_add(1, Ordering::SeqCst);
        assert!(!ops.contains(&14), "send panics");
        async move {
            tokio::task::yield_now().await;
            assert!(!ops.contains(&13), "the send future panics");
            Ok(ops.into_iter().map(Ok).collect())
        }
    }
}

/// `future`'s output, or a failure if it is still pending after a minute of (paused) time: a
/// stranded credit or endpoint shows as a hang, which this turns into a failed test.
async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("stranded: still pending after 60 s")
}

type Driver = BatchDriver<TokioRuntime, Echo, u8, u32, RandomState>;

fn driver(window: u32) -> Driver {
    let cfg = BatcherConfig::reads()
        .with_window(WindowConfig::default().with_max_in_flight(window as usize))
        .unwrap();
    BatchDriver::new(TokioRuntime::new(), Echo::default(), cfg)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_transport_that_panics_fails_its_batch_and_the_shard_keeps_serving() {
    let driver = driver(1);
    for poison in [13, 14] {
        assert!(
            matches!(
                within(driver.submit(1, poison)).await,
                Err(OpError::Panicked(Panicked))
            ),
            "op {poison}"
        );
        assert_eq!(driver.in_flight(&1), 0, "op {poison}: the credit came back");
        // A batch parked behind a panicking one, and one after it: both answered.
        let a = driver.submit(1, poison);
        while driver.queued() > 0 {
            tokio::task::yield_now().await; // until the driver task has sent it
        }
        let b = driver.submit(1, 7);
        assert!(matches!(within(a).await, Err(OpError::Panicked(_))));
        assert_eq!(within(b).await.unwrap(), 7);
        assert_eq!(within(driver.submit(1, 8)).await.unwrap(), 8);
    }
    driver.close();
    within(driver.closed()).await;
}

/// Connects to anything; the first connect's future panics (`connect()` itself if `eager`).
#[derive(Default)]
struct Flaky {
    connects: AtomicUsize,
    eager: bool,
}

impl Connector<u32> for Flaky {
    type Conn = u32;
    type Error = &'static str;

    fn connect(
        &self,
        host: &u32,
        _port: u16,
        _attempt: throttle_sansio::conn_key::ConnectAttempt,
    ) -> impl Future<Output = Result<u32, &'static str>> + Send + 'static {
        let first = self.connects.fetch_add(1, Ordering::SeqCst) == 0;
        assert!(!(first && self.eager), "connect() panics");
        let host = *host;
        async move {
            tokio::task::yield_now().await;
            assert!(!first, "the connect future panics");
            Ok(host)
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_connector_that_panics_fails_that_lease_and_the_next_one_connects() {
    for eager in [false, true] {
        let connector = Flaky {
            eager,
            ..Flaky::default()
        };
        let pool: ConnPool<TokioRuntime, Flaky, u32, u32, RandomState> =
            ConnPool::new(TokioRuntime::new(), connector, ConnConfig::default()).unwrap();
        let key = ConnKey::new(0, 7, 9123);
        let first = within(pool.lease(&key)).await;
        assert!(
            matches!(first, Err(PoolError::Panicked(Panicked))),
            "eager {eager}"
        );
        assert_eq!(pool.connection(&key), None, "not left connecting");
        let lease = within(pool.lease(&key))
            .await
            .expect("the next lease connects anew");
        assert_eq!(*lease, 7);
        drop(lease);
        pool.close();
        within(pool.closed()).await;
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_refresh_that_panics_fails_its_call_and_the_next_refresh_runs() {
    let fx = FailoverExecutor::new(
        TokioRuntime::new(),
        AdminWriteGateway,
        Unlimited,
        CallConfig::default(),
    )
    .unwrap();
    let call = |panics: bool| {
        let (fx, tries) = (fx.clone(), AtomicUsize::new(0));
        async move {
            fx.call(
                || {
                    let first = tries.fetch_add(1, Ordering::SeqCst) == 0;
                    async move {
                        if first {
                            Err(ErrorKind::NotLeader)
                        } else {
                            Ok(())
                        }
                    }
                },
                || async move {
                    tokio::task::yield_now().await;
                    assert!(!panics, "the refresh panics");
                    true
                },
            )
            .await
        }
    };
    assert_eq!(within(call(true)).await, Err(CallError::Panicked(Panicked)));
    assert!(!fx.is_refreshing());
    assert_eq!(within(call(false)).await, Ok(()));
    assert_eq!(fx.refreshes_started(), 2);
}

#[test]
fn a_batch_driver_built_outside_a_tokio_runtime_panics_as_documented() {
    // `TokioRuntime::new` outside a runtime has no handle: spawning the driver task panics.
    let outside = TokioRuntime::new();
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        BatchDriver::<_, Echo, u8, u32, RandomState>::new(
            outside,
            Echo::default(),
            BatcherConfig::reads(),
        )
    }));
    assert!(built.is_err());
    // With a handle it is built anywhere, and serves on that runtime.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let rt = TokioRuntime::with_handle(runtime.handle().clone());
    let driver: Driver = BatchDriver::new(rt, Echo::default(), BatcherConfig::reads());
    assert_eq!(runtime.block_on(driver.submit(1, 5)).unwrap(), 5);
    driver.close();
}
