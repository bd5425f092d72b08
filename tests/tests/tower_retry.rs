//! `FailoverPolicy` (feature `tower-retry`) under tower's own `Retry`, on tokio with paused
//! time: the retry count, the shared budget, the backoff and the deadline are the failover
//! `Call`'s, only errors that provably did not execute are retried, and a refresh is asked for
//! apart from the retry and coalesced across requests.

use core::time::Duration;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use throttle_sansio::backoff::BackoffConfig;
use throttle_sansio::failover::{
    AwsRetryQuota, AwsRetryQuotaConfig, CallConfig, ErrorClass, RetryBudget, Unlimited,
};
use throttle_sansio::sync::FailoverExecutor;
use throttle_sansio::sync::tower::FailoverPolicy;
use throttle_tokio::{Instant, TokioRuntime};
use tower::{ServiceBuilder, ServiceExt};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Rejected before execution by a node that is no longer the leader.
    NotLeader,
    /// Rejected before execution: try again.
    Busy,
    /// No answer in time: it may have executed.
    Timeout,
    /// Permanent.
    Fatal,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for Kind {}

fn classify(k: &Kind) -> ErrorClass {
    match k {
        Kind::NotLeader => ErrorClass::REFRESH_AND_RETRY,
        Kind::Busy => ErrorClass::RETRY,
        Kind::Timeout => ErrorClass::REFRESH_THEN_SURFACE,
        Kind::Fatal => ErrorClass::SURFACE,
    }
}

type Classify = fn(&Kind) -> ErrorClass;

/// Every send the inner service saw: (request id, time in ms).
type Log = Arc<Mutex<Vec<(u32, u64)>>>;

fn ms(rt: &TokioRuntime) -> u64 {
    rt.now().as_nanos() / 1_000_000
}

/// An inner service that answers each request with `answer(id, attempt)` and logs the send.
fn server<A: Fn(u32, usize) -> Result<u32, Kind> + Clone + Send + 'static>(
    rt: &TokioRuntime,
    log: &Log,
    answer: A,
) -> impl tower::Service<u32, Response = u32, Error = Kind, Future = impl Send + use<A>>
+ Clone
+ Send
+ use<A> {
    let (rt, log) = (rt.clone(), Arc::clone(log));
    tower::service_fn(move |id: u32| {
        let attempt = {
            let mut log = log.lock().unwrap();
            log.push((id, ms(&rt)));
            log.iter().filter(|(i, _)| *i == id).count()
        };
        let answer = answer.clone();
        async move { answer(id, attempt) }
    })
}

fn executor<B: RetryBudget>(
    rt: &TokioRuntime,
    budget: B,
    config: CallConfig,
) -> FailoverExecutor<TokioRuntime, Classify, B> {
    FailoverExecutor::new(rt.clone(), classify as Classify, budget, config).unwrap()
}

fn sends(log: &Log) -> Vec<(u32, u64)> {
    log.lock().unwrap().clone()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_is_retried_exactly_max_auto_retries_times() {
    let rt = TokioRuntime::new();
    // Busy until the `ok_at`-th send (never, for 0): sends seen, and the answer.
    for (ok_at, sent, answer) in [(0, 4, Err(Kind::Busy)), (3, 3, Ok(9))] {
        let log = Log::default();
        let fx = executor(
            &rt,
            Unlimited,
            CallConfig::default().with_max_auto_retries(3),
        );
        let svc = ServiceBuilder::new()
            .retry(FailoverPolicy::new(fx))
            .service(server(&rt, &log, move |id, attempt| {
                if attempt == ok_at {
                    Ok(id)
                } else {
                    Err(Kind::Busy)
                }
            }));
        assert_eq!(svc.oneshot(9).await, answer);
        assert_eq!(
            sends(&log).len(),
            sent,
            "the send and its retries (3 at most)"
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn only_errors_that_provably_did_not_execute_are_retried() {
    let rt = TokioRuntime::new();
    let log = Log::default();
    let refreshes = Arc::new(AtomicU32::new(0));
    let r = Arc::clone(&refreshes);
    let fx = executor(
        &rt,
        Unlimited,
        CallConfig::default().with_max_auto_retries(5),
    );
    let policy = FailoverPolicy::new(fx.clone()).with_refresh(move || {
        r.fetch_add(1, Ordering::SeqCst);
        async { true }
    });
    let svc = ServiceBuilder::new()
        .retry(policy)
        .service(server(&rt, &log, |id, _| {
            Err(if id == 1 { Kind::Fatal } else { Kind::Timeout })
        }));
    assert_eq!(svc.clone().oneshot(1).await, Err(Kind::Fatal));
    assert_eq!(svc.oneshot(2).await, Err(Kind::Timeout));
    assert_eq!(sends(&log), [(1, 0), (2, 0)], "neither was sent again");
    // The timeout's class asks for a refresh apart from the retry: it ran, in the background.
    tokio::task::yield_now().await;
    assert_eq!(refreshes.load(Ordering::SeqCst), 1);
    assert_eq!(fx.refreshes_started(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_shared_budget_grants_exactly_its_tokens_across_requests() {
    let rt = TokioRuntime::new();
    let log = Log::default();
    // 10 tokens, 5 per retry: two retries in all, whatever the requests' own limits.
    let quota = AwsRetryQuota::new(
        AwsRetryQuotaConfig::aws_standard()
            .with_max_tokens(10)
            .with_retry_cost(5),
    );
    let fx = executor(&rt, quota, CallConfig::default().with_max_auto_retries(5));
    let svc = ServiceBuilder::new()
        .retry(FailoverPolicy::new(fx.clone()))
        .service(server(&rt, &log, |_, _| Err(Kind::Busy)));
    for id in 0..3 {
        assert_eq!(svc.clone().oneshot(id).await, Err(Kind::Busy));
    }
    let per_request: Vec<usize> = (0..3)
        .map(|id| sends(&log).iter().filter(|(i, _)| *i == id).count())
        .collect();
    assert_eq!(
        per_request,
        [3, 1, 1],
        "the first request took both retries"
    );
    assert_eq!(fx.with_budget(|q| q.tokens()), 0);
}

fn fixed_100ms() -> BackoffConfig {
    BackoffConfig::constant(Duration::from_millis(100)).unwrap()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_backoff_and_the_deadline_are_the_calls() {
    let rt = TokioRuntime::new();
    let log = Log::default();
    let config = CallConfig::default()
        .with_max_auto_retries(10)
        .with_backoff(fixed_100ms());
    let fx = executor(&rt, Unlimited, config);
    // Each request's deadline: 250 ms after time zero.
    let policy = FailoverPolicy::new(fx).with_deadline(|_: &u32| Some(Instant::from_millis(250)));
    let svc = ServiceBuilder::new()
        .retry(policy)
        .service(server(&rt, &log, |_, _| Err(Kind::Busy)));
    assert_eq!(svc.oneshot(1).await, Err(Kind::Busy));
    // Sent at 0, retried after 100 ms twice; a third retry would start at 300 ms, past the
    // deadline, so the error at 200 ms is returned at 200 ms.
    assert_eq!(sends(&log), [(1, 0), (1, 100), (1, 200)]);
    assert_eq!(ms(&rt), 200);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_refresh_serves_every_request_that_failed_on_the_old_leader() {
    let rt = TokioRuntime::new();
    let log = Log::default();
    let moved = Arc::new(AtomicBool::new(false));
    let fx = executor(
        &rt,
        Unlimited,
        CallConfig::default().with_max_auto_retries(2),
    );
    let m = Arc::clone(&moved);
    let policy = FailoverPolicy::new(fx.clone()).with_refresh(move || {
        let m = Arc::clone(&m);
        async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            m.store(true, Ordering::SeqCst);
            true
        }
    });
    let seen = Arc::clone(&moved);
    let svc = ServiceBuilder::new()
        .retry(policy)
        .service(server(&rt, &log, move |id, _| {
            if seen.load(Ordering::SeqCst) {
                Ok(id)
            } else {
                Err(Kind::NotLeader)
            }
        }));
    let a = tokio::spawn(svc.clone().oneshot(1));
    let b = tokio::spawn(svc.oneshot(2));
    assert_eq!((a.await.unwrap(), b.await.unwrap()), (Ok(1), Ok(2)));
    assert_eq!(
        fx.refreshes_started(),
        1,
        "the second failure joined the first's refresh"
    );
    let mut log = sends(&log);
    log.sort();
    assert_eq!(
        log,
        [(1, 0), (1, 10), (2, 0), (2, 10)],
        "each retried once the refresh ended"
    );
}
