//! `FailoverExecutor` on tokio's paused time: shutdown (`close` + `closed`), the call deadline
//! (`call_until`), and errors that expose the request's error through `source()`.

use core::time::Duration;
use std::error::Error as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use throttle_sansio::Instant;
use throttle_sansio::backoff::BackoffConfig;
use throttle_sansio::failover::{
    AdminWriteGateway, CallConfig, ErrorKind, SurfaceReason, Unlimited,
};
use throttle_sansio::sync::{Attempt, CallError, FailoverExecutor, Surfaced, WakeSignal};
use throttle_tokio::TokioRuntime;

type Fx = FailoverExecutor<TokioRuntime, AdminWriteGateway, Unlimited>;

fn executor(config: CallConfig) -> (TokioRuntime, Fx) {
    let rt = TokioRuntime::new();
    let fx = FailoverExecutor::new(rt.clone(), AdminWriteGateway, Unlimited, config).unwrap();
    (rt, fx)
}

/// 100 ms before every retry, unjittered.
fn fixed_100ms() -> BackoffConfig {
    BackoffConfig::constant(Duration::from_millis(100)).unwrap()
}

/// Lets the spawned tasks run until they all wait (paused time does not advance here).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn close_refuses_new_calls_and_closed_waits_for_the_call_in_its_refresh() {
    let (_rt, fx) = executor(CallConfig::default());
    let lookup = WakeSignal::new();
    let moved = Arc::new(AtomicBool::new(false));
    // A call whose first send fails with not-leader; its refresh waits for `lookup`.
    let (f, l, m) = (fx.clone(), lookup.clone(), Arc::clone(&moved));
    let first = tokio::spawn(async move {
        f.call(
            || {
                let ok = m.load(Ordering::SeqCst);
                async move { if ok { Ok(1) } else { Err(ErrorKind::NotLeader) } }
            },
            || {
                let (changed, m) = (l.changed(0), Arc::clone(&m));
                async move {
                    changed.await;
                    m.store(true, Ordering::SeqCst);
                    true
                }
            },
        )
        .await
    });
    settle().await;
    assert!(fx.is_refreshing());
    assert_eq!(fx.in_flight(), 1);

    fx.close();
    // A new call fails at once and sends nothing.
    let sends = AtomicUsize::new(0);
    let refused = fx
        .call(
            || {
                sends.fetch_add(1, Ordering::SeqCst);
                async { Ok::<u32, ErrorKind>(2) }
            },
            || async { true },
        )
        .await;
    assert_eq!(refused, Err(CallError::Closed));
    assert_eq!(sends.load(Ordering::SeqCst), 0);
    // `closed` waits while the first call is in its refresh (a minute of paused time).
    let waited = tokio::time::timeout(Duration::from_secs(60), fx.closed()).await;
    assert!(waited.is_err(), "closed resolved with a call in flight");

    lookup.notify();
    tokio::time::timeout(Duration::from_secs(60), fx.closed())
        .await
        .expect("closed resolves once the call has ended");
    assert_eq!(first.await.unwrap(), Ok(1), "the call in flight finished");
    assert_eq!(fx.in_flight(), 0);
    assert!(fx.is_closed() && !fx.is_refreshing());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn closed_counts_out_a_call_dropped_mid_refresh() {
    let (_rt, fx) = executor(CallConfig::default());
    let (f, never) = (fx.clone(), core::future::pending::<bool>);
    let task = tokio::spawn(async move {
        f.call(|| async { Err::<(), _>(ErrorKind::NotLeader) }, never)
            .await
    });
    settle().await;
    assert_eq!(fx.in_flight(), 1);
    fx.close();
    task.abort();
    let _ = task.await;
    tokio::time::timeout(Duration::from_secs(60), fx.closed())
        .await
        .expect("closed resolves once the dropped call is counted out");
    assert_eq!(fx.in_flight(), 0);
    assert!(
        !fx.is_refreshing(),
        "the dropped refresher ended its refresh"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn call_until_starts_no_attempt_at_or_after_the_deadline_and_tells_each_its_time_left() {
    let config = CallConfig::default()
        .with_max_auto_retries(10)
        .with_backoff(fixed_100ms());
    let (rt, fx) = executor(config);
    let deadline = Instant::from_millis(250);
    let log: Arc<Mutex<Vec<(Instant, Attempt)>>> = Arc::default();
    let (l, rt2) = (Arc::clone(&log), rt.clone());
    let got = fx
        .call_until(
            Some(deadline),
            move |a| {
                l.lock().unwrap().push((rt2.now(), a));
                async { Err::<(), _>(ErrorKind::NotLeader) }
            },
            || async { true },
        )
        .await;
    assert_eq!(
        got,
        Err(CallError::Surfaced(Surfaced::new(
            ErrorKind::NotLeader,
            SurfaceReason::DeadlineExceeded
        )))
    );
    let log = log.lock().unwrap();
    let seen: Vec<(u64, u64, u64)> = log
        .iter()
        .map(|(at, a)| {
            let left = a.time_left.unwrap().as_millis() as u64;
            (at.as_nanos() / 1_000_000, a.number, left)
        })
        .collect();
    // At 200 ms the next retry would start at 300 ms, past 250 ms.
    assert_eq!(seen, [(0, 1, 250), (100, 2, 150), (200, 3, 50)]);
    assert_eq!(
        rt.now(),
        Instant::from_millis(200),
        "no sleep toward the deadline"
    );
    assert_eq!(fx.refreshes_started(), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn call_until_a_passed_deadline_sends_nothing() {
    let (_rt, fx) = executor(CallConfig::default());
    tokio::time::advance(Duration::from_millis(10)).await;
    let got = fx
        .call_until(
            Some(Instant::from_millis(10)),
            |_| async { Ok::<(), ErrorKind>(()) },
            || async { true },
        )
        .await;
    assert_eq!(got, Err(CallError::Expired));
    assert_eq!(fx.in_flight(), 0);
}

/// A `ManualClock` runtime whose timers wake 3 ms late, as a loaded real timer may.
#[derive(Clone)]
struct Late(throttle_sansio::sync::ManualClock);

impl throttle_sansio::sync::Runtime for Late {
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn sleep_until(&self, at: Instant) -> impl core::future::Future<Output = ()> + Send + 'static {
        self.0.sleep_until(at + Duration::from_millis(3))
    }
    fn spawn<F: core::future::Future<Output = ()> + Send + 'static>(&self, _: F) {}
}

#[test]
fn call_until_sends_no_retry_whose_timer_woke_past_the_deadline() {
    use core::task::{Context, Poll, Waker};
    let clock = throttle_sansio::sync::ManualClock::new();
    let config = CallConfig::default()
        .with_max_auto_retries(5)
        .with_backoff(fixed_100ms());
    let fx =
        FailoverExecutor::new(Late(clock.clone()), AdminWriteGateway, Unlimited, config).unwrap();
    let sends = AtomicUsize::new(0);
    let call = fx.call_until(
        Some(Instant::from_millis(101)),
        |_| {
            sends.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(ErrorKind::NotLeader) }
        },
        || async { true },
    );
    let mut call = core::pin::pin!(call);
    let mut cx = Context::from_waker(Waker::noop());
    let got = loop {
        match call.as_mut().poll(&mut cx) {
            Poll::Ready(got) => break got,
            Poll::Pending => clock.advance_to(clock.next_deadline().unwrap()),
        }
    };
    assert_eq!(
        got,
        Err(CallError::Surfaced(Surfaced::new(
            ErrorKind::NotLeader,
            SurfaceReason::DeadlineExceeded
        )))
    );
    assert_eq!(sends.load(Ordering::SeqCst), 1, "no send at 103 ms");
    assert_eq!(clock.now(), Instant::from_millis(103));
}

/// A user error with a cause of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NotCoordinator;

impl core::fmt::Display for NotCoordinator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("this server is not the coordinator")
    }
}

impl std::error::Error for NotCoordinator {}

impl throttle_sansio::failover::HasErrorKind for NotCoordinator {
    fn error_kind(&self) -> ErrorKind {
        ErrorKind::NotLeader
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_surfaced_error_says_why_and_keeps_the_users_error_as_its_source() {
    let rt = TokioRuntime::new();
    let fx =
        FailoverExecutor::new(rt, AdminWriteGateway, Unlimited, CallConfig::default()).unwrap();
    let err = fx
        .call(|| async { Err::<(), _>(NotCoordinator) }, || async { true })
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "request failed and was not retried: the automatic retries are used up"
    );
    let source = err.source().expect("the user's error is the source");
    assert_eq!(source.to_string(), "this server is not the coordinator");
    assert!(source.downcast_ref::<NotCoordinator>().is_some());
    assert_eq!(err.into_error(), Some(NotCoordinator));
    assert!(CallError::<NotCoordinator>::Closed.source().is_none());
}
