//! The batch driver's operation timeouts, oversized rejection and requeue-and-pause of torn
//! streams (issue 15 items 6, 7 and 8), on tokio with paused time: every delay is virtual, so
//! each run is the same and the instants asserted are exact.
//!
//! The scenario of item 8 is the Rust Oxia client's: writes to one shard travel on one ordered
//! stream; when the stream tears, the batches on it were not executed, the client waits out a
//! reconnect backoff, and sends them again, in their order, before anything later.

use core::future::Future;
use core::time::Duration;
use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use throttle_sansio::sync::{BatchDriver, BatchOutcome, OpError, SendOrder, Transport};
use throttle_sansio::{BackoffConfig, BatcherConfig, Instant, Jitter, Oversized, WindowConfig};
use throttle_tokio::TokioRuntime;

/// The errors of the fake shard's write stream.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StreamError {
    /// The stream broke before the server took the batch.
    Torn,
    /// The server refused the batch.
    Refused,
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StreamError::Torn => "the write stream tore",
            StreamError::Refused => "the server refused the batch",
        })
    }
}

impl std::error::Error for StreamError {}

/// What the fake server saw, shared with the test.
#[derive(Default)]
struct Seen {
    /// Every key the server executed, in order.
    executed: Vec<u64>,
    /// Each `send` call: when, and which keys.
    sends: Vec<(Instant, Vec<u64>)>,
}

/// One shard's ordered write stream. The first `tears` sends fail with
/// [`StreamError::Torn`] after 1 ms (the stream broke under them; nothing executed); every
/// later send is executed at once, in call order (the stream is ordered), and answered after
/// 2 ms. A batch holding [`HANG`] is never answered; one holding [`PANIC_TORN`] makes
/// [`Transport::torn`] panic.
#[derive(Clone)]
struct Stream {
    rt: TokioRuntime,
    seen: Arc<Mutex<Seen>>,
    tears: Arc<AtomicUsize>,
    /// Failures to return as [`StreamError::Refused`] rather than torn.
    refuse: bool,
}

const HANG: u64 = 999;
const PANIC_TORN: u64 = 998;

impl Stream {
    fn new(rt: &TokioRuntime, tears: usize) -> Self {
        Stream {
            rt: rt.clone(),
            seen: Arc::default(),
            tears: Arc::new(AtomicUsize::new(tears)),
            refuse: false,
        }
    }

    fn executed(&self) -> Vec<u64> {
        self.seen.lock().unwrap().executed.clone()
    }

    fn sends(&self) -> Vec<(Instant, Vec<u64>)> {
        self.seen.lock().unwrap().sends.clone()
    }
}

impl Transport<u8, u64> for Stream {
    type Output = u64;
    type Error = StreamError;

    fn op_bytes(&self, op: &u64) -> u64 {
        *op
    }

    fn send(
        &self,
        _shard: &u8,
        keys: Vec<u64>,
    ) -> impl Future<Output = BatchOutcome<u64, StreamError>> + Send + 'static {
        let now = self.rt.now();
        let torn = self
            .tears
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let hang = keys.contains(&HANG);
        let mut seen = self.seen.lock().unwrap();
        seen.sends.push((now, keys.clone()));
        if !torn && !hang {
            seen.executed.extend(&keys);
        }
        drop(seen);
        let (refuse, rt) = (self.refuse, self.rt.clone());
        async move {
            if hang {
                core::future::pending::<()>().await;
            }
            if torn {
                rt.sleep_until(now + Duration::from_millis(1)).await;
                return Err(if refuse {
                    StreamError::Refused
                } else {
                    StreamError::Torn
                });
            }
            rt.sleep_until(now + Duration::from_millis(2)).await;
            Ok(keys.into_iter().map(Ok).collect())
        }
    }

    fn torn(&self, error: &StreamError) -> bool {
        assert!(
            !self
                .seen
                .lock()
                .unwrap()
                .sends
                .iter()
                .any(|(_, k)| k.contains(&PANIC_TORN)),
            "the classifier panics"
        );
        *error == StreamError::Torn
    }
}

/// A reconnect backoff without jitter: 100 ms, then 200 ms, 400 ms …, at most `attempts`.
fn reconnect(attempts: Option<u32>) -> BackoffConfig {
    BackoffConfig::builder()
        .initial(Duration::from_millis(100))
        .max(Duration::from_secs(1))
        .multiplier(2, 1)
        .jitter(Jitter::None)
        .max_attempts(attempts)
        .build()
        .expect("a valid backoff")
}

/// Writes in batches of up to 3, up to `in_flight` batches per shard at once.
fn writes(in_flight: usize) -> BatcherConfig {
    BatcherConfig::writes()
        .with_max_requests_per_batch(NonZeroUsize::new(3).unwrap())
        .with_window(WindowConfig::default().with_max_in_flight(in_flight))
        .expect("a window above 0 is valid")
}

fn ordered(
    rt: &TokioRuntime,
    stream: &Stream,
    cfg: BatcherConfig,
    attempts: Option<u32>,
) -> BatchDriver<TokioRuntime, Stream, u8, u64> {
    BatchDriver::builder(rt.clone(), stream.clone(), cfg)
        .with_send_order(SendOrder::PerShard)
        .with_requeue(reconnect(attempts))
        .build()
}

/// Issue 15 item 8, the Rust Oxia client's torn write stream: keys 1, 1, 1 then 2, 2, 2 to
/// one shard, two batches in flight on the ordered stream, and the stream tears under both.
/// The shard pauses for the reconnect backoff (100 ms), then both batches go again, in their
/// order: the server executes 1, 1, 1 before 2, 2, 2, and each write resolves exactly once,
/// with its own key.
#[tokio::test(start_paused = true)]
async fn a_torn_stream_resends_its_batches_in_order_after_the_reconnect_backoff() {
    let rt = TokioRuntime::new();
    let start = rt.now();
    let stream = Stream::new(&rt, 2);
    let driver = ordered(&rt, &stream, writes(2), None);
    let puts: Vec<_> = [1, 1, 1, 2, 2, 2]
        .into_iter()
        .map(|k| driver.submit(7, k))
        .collect();
    for (i, put) in puts.into_iter().enumerate() {
        let want = if i < 3 { 1 } else { 2 };
        assert_eq!(put.await.unwrap(), want, "write {i}");
    }
    assert_eq!(stream.executed(), [1, 1, 1, 2, 2, 2], "the server's order");
    let sends = stream.sends();
    let keys: Vec<_> = sends.iter().map(|(_, k)| k.clone()).collect();
    assert_eq!(
        keys,
        [vec![1, 1, 1], vec![2, 2, 2], vec![1, 1, 1], vec![2, 2, 2]],
        "both batches torn, then both resent in order"
    );
    // The tear is reported 1 ms in; the shard is paused for 100 ms from then.
    assert_eq!(
        sends[2].0 - start,
        Duration::from_millis(101),
        "resent after the backoff"
    );
    assert_eq!(driver.in_flight(&7), 0, "every credit back");
    driver.close();
    driver.closed().await;
}

/// Later writes submitted while the shard is paused wait behind the requeued batch; the
/// backoff grows while the stream keeps tearing (100 ms, then 200 ms) and starts afresh once
/// a batch is answered.
#[tokio::test(start_paused = true)]
async fn writes_during_the_pause_queue_behind_the_torn_batch_and_the_backoff_grows() {
    let rt = TokioRuntime::new();
    let start = rt.now();
    let stream = Stream::new(&rt, 2);
    let driver = ordered(&rt, &stream, writes(1), None);
    let first = driver.submit(7, 1);
    tokio::time::sleep(Duration::from_millis(50)).await; // the first send tore at 1 ms
    let second = driver.submit(7, 2);
    assert_eq!(first.await.unwrap(), 1);
    assert_eq!(second.await.unwrap(), 2);
    assert_eq!(stream.executed(), [1, 2]);
    let at: Vec<Duration> = stream.sends().iter().map(|(t, _)| *t - start).collect();
    // Torn at 1 ms, paused 100 ms: resent at 101 ms, torn again at 102 ms, paused 200 ms.
    assert_eq!(
        at,
        [
            Duration::ZERO,
            Duration::from_millis(101),
            Duration::from_millis(302),
            Duration::from_millis(304),
        ]
    );
    // The backoff restarted with the answer: a new tear pauses 100 ms again.
    stream.tears.store(1, Ordering::SeqCst);
    let t = rt.now();
    let third = driver.submit(7, 3);
    assert_eq!(third.await.unwrap(), 3);
    let last = stream.sends().last().cloned().unwrap();
    assert_eq!(last.0 - t, Duration::from_millis(101));
    driver.close();
}

/// A backoff that refuses another delay (its attempts spent) fails the torn batch with the
/// transport's error instead of pausing again; a failure the transport does not class as
/// torn fails the batch at once, as before.
#[tokio::test(start_paused = true)]
async fn a_spent_backoff_or_an_error_that_is_not_a_tear_fails_the_batch() {
    let rt = TokioRuntime::new();
    let stream = Stream::new(&rt, 5);
    let driver = ordered(&rt, &stream, writes(1), Some(2));
    match driver.submit(7, 1).await {
        Err(OpError::Batch(failure)) => assert_eq!(*failure, StreamError::Torn),
        other => panic!("expected the torn batch to fail, got {other:?}"),
    }
    assert_eq!(
        stream.sends().len(),
        3,
        "sent, then resent twice (2 attempts)"
    );
    assert_eq!(driver.in_flight(&7), 0);

    let mut refusing = Stream::new(&rt, 1);
    refusing.refuse = true;
    let driver = ordered(&rt, &refusing, writes(1), None);
    assert!(matches!(
        driver.submit(7, 1).await,
        Err(OpError::Batch(f)) if *f == StreamError::Refused
    ));
    assert_eq!(refusing.sends().len(), 1, "not a tear: not resent");
    driver.close();
}

/// A classifier (`torn`) that panics fails its batch like any other failure: the credit
/// comes back and the shard's next write goes.
#[tokio::test(start_paused = true)]
async fn a_panicking_tear_classifier_fails_the_batch_and_strands_nothing() {
    let rt = TokioRuntime::new();
    let stream = Stream::new(&rt, 1);
    let driver = ordered(&rt, &stream, writes(1), None);
    assert!(matches!(
        driver.submit(7, PANIC_TORN).await,
        Err(OpError::Batch(_))
    ));
    assert_eq!(driver.in_flight(&7), 0, "the credit is back");
    assert_eq!(driver.submit(7, 4).await.unwrap(), 4);
    driver.close();
    driver.closed().await;
}

/// A draining close while a torn shard is paused still resends the torn batch after the
/// backoff, and resolves once it is answered.
#[tokio::test(start_paused = true)]
async fn a_drain_during_the_pause_waits_for_the_resend() {
    let rt = TokioRuntime::new();
    let stream = Stream::new(&rt, 1);
    let driver = ordered(&rt, &stream, writes(1), None);
    let put = driver.submit(7, 1);
    tokio::time::sleep(Duration::from_millis(10)).await; // torn at 1 ms, paused
    driver.drain().await;
    assert_eq!(put.await.unwrap(), 1);
    assert_eq!(stream.executed(), [1]);
}

/// Issue 15 item 7, Oxia's `RequestTooLarge`: with `Oversized::Reject`, a write larger than
/// the batch limit is refused by `submit` at once, with its size and the limit; the transport
/// never sees it and the shard's other writes are unaffected. The default sends it alone.
#[tokio::test(start_paused = true)]
async fn an_oversized_write_is_refused_at_submit_when_the_config_rejects_them() {
    let rt = TokioRuntime::new();
    let stream = Stream::new(&rt, 0);
    let limit = NonZeroU64::new(100).unwrap();
    let cfg = writes(1)
        .with_max_batch_bytes(limit)
        .with_oversized(Oversized::Reject);
    let driver: BatchDriver<_, _, u8, u64> = BatchDriver::new(rt.clone(), stream.clone(), cfg);
    let start = rt.now();
    // Polled once, before the driver task has run: the refusal is already there.
    let mut big = driver.submit(7, 150);
    let first = core::pin::Pin::new(&mut big).poll(&mut core::task::Context::from_waker(
        core::task::Waker::noop(),
    ));
    match first {
        core::task::Poll::Ready(Err(e @ OpError::TooLarge { .. })) => {
            assert!(matches!(
                e,
                OpError::TooLarge {
                    bytes: 150,
                    limit: 100
                }
            ));
            assert_eq!(
                e.to_string(),
                "the operation of 150 bytes exceeds the batch limit of 100 bytes"
            );
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(rt.now(), start, "refused at once");
    assert_eq!(driver.queued(), 0);
    assert_eq!(driver.submit(7, 40).await.unwrap(), 40);
    assert_eq!(stream.executed(), [40]);
    driver.close();

    let travels = BatchDriver::new(
        rt.clone(),
        stream.clone(),
        writes(1).with_max_batch_bytes(limit),
    );
    assert_eq!(
        travels.submit(7, 150).await.unwrap(),
        150,
        "the default sends it alone"
    );
    travels.close();
}

/// Issue 15 item 6, the Oxia Java client's request timeout (streamnative/oxia-java,
/// `OxiaClientBuilder` `DefaultRequestTimeout`, 30 s): a batch the server never answers
/// fails with `OpError::TimedOut` at its oldest write's deadline, its credit goes to the
/// shard's next batch, and a write held back past its own deadline fails without ever being
/// sent. Times are exact (paused tokio time).
#[tokio::test(start_paused = true)]
async fn a_hung_batch_and_a_write_held_behind_it_time_out_at_their_deadlines() {
    let rt = TokioRuntime::new();
    let stream = Stream::new(&rt, 0);
    let cfg = writes(1).with_op_timeout(Duration::from_secs(30));
    let driver: BatchDriver<_, _, u8, u64> = BatchDriver::new(rt.clone(), stream.clone(), cfg);
    let start = rt.now();
    let hung = tokio::spawn(driver.submit(7, HANG));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let held = tokio::spawn(driver.submit(7, 5));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(stream.sends().len(), 1, "5 waits for the credit HANG holds");
    let hung = hung.await.unwrap();
    assert!(matches!(hung, Err(OpError::TimedOut(_))), "{hung:?}");
    assert_eq!(
        rt.now() - start,
        Duration::from_secs(30),
        "at HANG's deadline"
    );
    // The credit came back at 30 s: 5 (due at 40 s) was sent then, and is answered.
    assert_eq!(held.await.unwrap().unwrap(), 5);
    assert_eq!(stream.sends().len(), 2);

    assert_eq!(driver.in_flight(&7), 0, "every credit back");
    driver.close();
    driver.closed().await;
}

/// Issue 15 items 6 and 8 together: a torn write waiting out a reconnect backoff longer than
/// the request timeout (60 s against 30 s) times out while paused, and is not sent again.
#[tokio::test(start_paused = true)]
async fn a_torn_write_paused_past_its_deadline_times_out_and_is_not_resent() {
    let rt = TokioRuntime::new();
    let stream = Stream::new(&rt, 1);
    let cfg = writes(1).with_op_timeout(Duration::from_secs(30));
    let slow = BackoffConfig::builder()
        .initial(Duration::from_secs(60))
        .max(Duration::from_secs(60))
        .jitter(Jitter::None)
        .build()
        .expect("a valid backoff");
    let driver: BatchDriver<_, _, u8, u64> = BatchDriver::builder(rt.clone(), stream.clone(), cfg)
        .with_requeue(slow)
        .build();
    let start = rt.now();
    let put = driver.submit(7, 1).await;
    assert!(matches!(put, Err(OpError::TimedOut(_))), "{put:?}");
    assert_eq!(rt.now() - start, Duration::from_secs(30), "its deadline");
    tokio::time::sleep(Duration::from_secs(60)).await; // past the resume
    assert_eq!(stream.sends().len(), 1, "torn once, never resent");
    assert_eq!(driver.in_flight(&7), 0);
    driver.close();
    driver.closed().await;
}
