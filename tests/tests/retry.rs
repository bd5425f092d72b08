//! The retry helper (`throttle_sansio::sync::retry`) on tokio's paused time, on the core's
//! `ManualClock`, and once on async-std's real clock.

use core::future::{Future, IntoFuture};
use core::task::{Context, Poll, Waker};
use core::time::Duration;
use std::error::Error as _;
use std::sync::{Arc, Mutex};

use throttle_sansio::Instant;
use throttle_sansio::backoff::{BackoffConfig, Jitter};
use throttle_sansio::failover::{FinagleBudget, FinagleBudgetConfig, SurfaceReason};
use throttle_sansio::sync::{
    Attempt, ManualClock, Panicked, RetryError, Runtime, SharedBudget, Surfaced, retry,
};
use throttle_tokio::TokioRuntime;

/// 100, 200, 400 … ms, capped at 10 s, unjittered.
fn doubling() -> BackoffConfig {
    BackoffConfig::builder()
        .initial(Duration::from_millis(100))
        .jitter(Jitter::None)
        .build()
        .unwrap()
}

/// 100 ms every time, unjittered.
fn fixed_100ms() -> BackoffConfig {
    doubling()
        .to_builder()
        .max(Duration::from_millis(100))
        .build()
        .unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Busy;

impl core::fmt::Display for Busy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("service busy")
    }
}

impl std::error::Error for Busy {}

/// Records each attempt (its start on the runtime's clock and what it was told) and fails it.
fn failing<R: Runtime>(
    rt: &R,
    log: &Arc<Mutex<Vec<(Instant, Attempt)>>>,
) -> impl FnMut(Attempt) -> core::future::Ready<Result<(), Busy>> + Send + 'static {
    let (rt, log) = (rt.clone(), Arc::clone(log));
    move |a| {
        log.lock().unwrap().push((rt.now(), a));
        core::future::ready(Err(Busy))
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_attempt_starts_at_or_after_the_deadline() {
    let rt = TokioRuntime::new();
    let log = Arc::default();
    let deadline = Instant::from_millis(350);
    let got = retry(rt.clone(), failing(&rt, &log))
        .backoff(fixed_100ms())
        .max_retries(u32::MAX)
        .deadline(deadline)
        .await;
    assert_eq!(
        got,
        Err(RetryError::Surfaced(Surfaced::new(
            Busy,
            SurfaceReason::DeadlineExceeded
        )))
    );
    let starts: Vec<u64> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(at, _)| at.as_nanos() / 1_000_000)
        .collect();
    // The retry after 300 ms would start at 400 ms, past 350 ms: it is not made.
    assert_eq!(starts, [0, 100, 200, 300]);
    assert_eq!(
        rt.now(),
        Instant::from_millis(300),
        "no sleep past the deadline"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_delay_that_would_cross_the_deadline_is_not_slept_at_all() {
    // A 1 s backoff under a 250 ms deadline: the helper gives up at once rather than sleeping
    // a second (or up to the deadline) for a retry that could not start in time.
    let rt = TokioRuntime::new();
    let log = Arc::default();
    let slow = doubling()
        .to_builder()
        .initial(Duration::from_secs(1))
        .build()
        .unwrap();
    let got = retry(rt.clone(), failing(&rt, &log))
        .backoff(slow)
        .deadline(Instant::from_millis(250))
        .await;
    let err = got.unwrap_err();
    assert!(matches!(
        err,
        RetryError::Surfaced(Surfaced {
            reason: SurfaceReason::DeadlineExceeded,
            ..
        })
    ));
    assert_eq!(rt.now(), Instant::ZERO);
    assert_eq!(log.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn time_left_shrinks_with_every_attempt() {
    let rt = TokioRuntime::new();
    let log = Arc::default();
    let deadline = Instant::from_millis(1_000);
    let _ = retry(rt.clone(), failing(&rt, &log))
        .backoff(doubling())
        .max_retries(10)
        .deadline(deadline)
        .await;
    let log = log.lock().unwrap();
    assert_eq!(
        log.len(),
        4,
        "attempts at 0, 100, 300, 700 ms; 1500 ms is too late"
    );
    let mut previous = Duration::MAX;
    for (i, (at, attempt)) in log.iter().enumerate() {
        let left = attempt.time_left.expect("a deadline was set");
        assert_eq!(*at + left, deadline, "told exactly the time left");
        assert!(left < previous, "time left shrinks");
        assert_eq!(attempt.number, i as u64 + 1);
        previous = left;
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn notify_sees_each_error_and_delay_before_its_sleep() {
    let rt = TokioRuntime::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let rt2 = rt.clone();
    let got = retry(rt.clone(), |a| async move {
        if a.number <= 3 {
            Err(Busy)
        } else {
            Ok(a.number)
        }
    })
    .backoff(doubling())
    .notify(move |e: &Busy, after| s.lock().unwrap().push((*e, after, rt2.now())))
    .await;
    assert_eq!(got, Ok(4));
    let ms = Duration::from_millis;
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (Busy, ms(100), Instant::from_millis(0)),
            (Busy, ms(200), Instant::from_millis(100)),
            (Busy, ms(400), Instant::from_millis(300)),
        ]
    );
    assert_eq!(rt.now(), Instant::from_millis(700));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_shared_budget_refuses_once_spent_and_names_it() {
    // A reserve of exactly 2 retries per second, nothing earned per request.
    let cfg = FinagleBudgetConfig::default()
        .with_ttl(Duration::from_secs(1))
        .with_min_retries_per_sec(2)
        .with_percent_can_retry_ppm(0);
    let budget = SharedBudget::new(FinagleBudget::new(cfg).unwrap());
    let rt = TokioRuntime::new();
    let log = Arc::default();
    let got = retry(rt.clone(), failing(&rt, &log))
        .backoff(fixed_100ms())
        .max_retries(10)
        .budget(&budget)
        .await;
    assert_eq!(
        got.unwrap_err().into_error(),
        Some(Busy),
        "the last error comes back"
    );
    assert_eq!(
        log.lock().unwrap().len(),
        3,
        "the first attempt and two retries"
    );
    assert_eq!(budget.with(|b| b.balance(rt.now())), 0);
    // A second operation on the same budget gets no retry at all.
    let log2 = Arc::default();
    let got = retry(rt.clone(), failing(&rt, &log2))
        .backoff(fixed_100ms())
        .budget(&budget)
        .await;
    assert!(matches!(
        got,
        Err(RetryError::Surfaced(Surfaced {
            reason: SurfaceReason::BudgetEmpty,
            ..
        }))
    ));
    assert_eq!(log2.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn when_refuses_an_error_and_limits_end_the_retries_with_their_reason() {
    let rt = TokioRuntime::new();
    let log = Arc::default();
    let got = retry(rt.clone(), failing(&rt, &log))
        .backoff(fixed_100ms())
        .when(|_: &Busy| false)
        .await;
    let reason = |r: Result<(), RetryError<Busy>>| match r {
        Err(RetryError::Surfaced(s)) => s.reason,
        other => panic!("{other:?}"),
    };
    assert_eq!(reason(got), SurfaceReason::ClassifiedNever);
    assert_eq!(log.lock().unwrap().len(), 1);
    // The default: 3 retries.
    let got = retry(rt.clone(), failing(&rt, &log))
        .backoff(fixed_100ms())
        .await;
    assert_eq!(reason(got), SurfaceReason::RetriesExhausted);
    assert_eq!(log.lock().unwrap().len(), 1 + 4);
    // Gobblin's maxRetries on the backoff ends them first.
    let two = fixed_100ms()
        .to_builder()
        .max_attempts(Some(2))
        .build()
        .unwrap();
    let got = retry(rt.clone(), failing(&rt, &log)).backoff(two).await;
    assert_eq!(reason(got), SurfaceReason::BackoffExhausted);
    assert_eq!(log.lock().unwrap().len(), 5 + 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_deadline_already_passed_runs_nothing() {
    let rt = TokioRuntime::new();
    tokio::time::advance(Duration::from_millis(5)).await;
    let log = Arc::default();
    let got = retry(rt.clone(), failing(&rt, &log))
        .deadline(Instant::from_millis(5))
        .await;
    assert_eq!(got, Err(RetryError::Expired));
    assert!(log.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn panics_in_user_code_are_errors_and_leave_the_shared_budget_usable() {
    // Finagle's reserve of 100 retries, without deposits, so every withdrawal shows.
    let cfg = FinagleBudgetConfig::default().with_percent_can_retry_ppm(0);
    let budget = SharedBudget::new(FinagleBudget::new(cfg).unwrap());
    let rt = TokioRuntime::new();
    let op_panics = retry(rt.clone(), |_| -> core::future::Ready<Result<(), Busy>> {
        panic!("op panics")
    })
    .budget(&budget)
    .await;
    assert_eq!(op_panics, Err(RetryError::Panicked(Panicked)));
    let future_panics = retry(rt.clone(), |_| async {
        panic!("the op's future panics");
        #[allow(unreachable_code)]
        Err::<(), Busy>(Busy)
    })
    .budget(&budget)
    .await;
    assert_eq!(future_panics, Err(RetryError::Panicked(Panicked)));
    let when_panics = retry(rt.clone(), |_| async { Err::<(), _>(Busy) })
        .when(|_: &Busy| -> bool { panic!("when panics") })
        .budget(&budget)
        .await;
    assert_eq!(when_panics, Err(RetryError::Panicked(Panicked)));
    let before = budget.with(|b| b.balance(rt.now()));
    let notify_panics = retry(rt.clone(), |_| async { Err::<(), _>(Busy) })
        .backoff(fixed_100ms())
        .notify(|_: &Busy, _| panic!("notify panics"))
        .budget(&budget)
        .await;
    assert_eq!(notify_panics, Err(RetryError::Panicked(Panicked)));
    // The retry decided before notify took its withdrawal (documented); nothing else moved.
    assert_eq!(budget.with(|b| b.balance(rt.now())), before - 1);
    // The budget is still usable: a later retry draws from it and succeeds.
    let ok = retry(rt.clone(), |a| async move {
        if a.number == 1 {
            Err(Busy)
        } else {
            Ok(a.number)
        }
    })
    .backoff(fixed_100ms())
    .budget(&budget)
    .await;
    assert_eq!(ok, Ok(2));
    assert_eq!(budget.with(|b| b.balance(rt.now())), before - 2);
}

/// A budget whose withdrawal panics the first time, then allows every retry.
#[derive(Default)]
struct PanicsOnce {
    panicked: bool,
}

impl throttle_sansio::failover::RetryBudget for PanicsOnce {
    fn handle_request(&mut self, _: Instant) {}
    fn handle_failure(&mut self, _: Instant) {}
    fn handle_success(&mut self, _: Instant) {}
    fn try_withdraw(&mut self, _: Instant) -> bool {
        if !self.panicked {
            self.panicked = true;
            panic!("the budget panics");
        }
        true
    }
    fn can_retry(&self, _: Instant) -> bool {
        true
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_budget_that_panics_is_an_error_and_the_shared_budget_keeps_serving() {
    let budget = SharedBudget::new(PanicsOnce::default());
    let rt = TokioRuntime::new();
    let flaky = |a: Attempt| async move {
        if a.number == 1 {
            Err(Busy)
        } else {
            Ok(a.number)
        }
    };
    let first = retry(rt.clone(), flaky).budget(&budget).await;
    assert_eq!(first, Err(RetryError::Panicked(Panicked)));
    let second = retry(rt.clone(), flaky).budget(&budget).await;
    assert_eq!(second, Ok(2), "the lock the panic crossed is recovered");
}

#[test]
fn errors_describe_this_layer_and_expose_the_operation_error_as_source() {
    let err: RetryError<Busy> = Surfaced::new(Busy, SurfaceReason::DeadlineExceeded).into();
    assert_eq!(
        err.to_string(),
        "request failed and was not retried: the call's deadline leaves no time for a retry"
    );
    assert_eq!(
        err.source().map(|s| s.to_string()),
        Some("service busy".into())
    );
    assert!(RetryError::<Busy>::Expired.source().is_none());
}

/// A runtime whose time is a `ManualClock`.
#[derive(Clone)]
struct Manual(ManualClock);

impl Runtime for Manual {
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + 'static {
        self.0.sleep_until(at)
    }
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, _: F) {
        unreachable!("the retry helper spawns nothing")
    }
}

/// Polls `fut` to its end, jumping the clock to the next sleeper's deadline whenever it waits.
fn run_on<F: Future>(clock: &ManualClock, fut: F) -> F::Output {
    let mut fut = core::pin::pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        let next = clock.next_deadline().expect("pending only on a sleep");
        clock.advance_to(next);
    }
}

#[test]
fn on_a_manual_clock_no_attempt_starts_after_the_deadline_and_no_sleep_reaches_it() {
    let clock = ManualClock::new();
    let rt = Manual(clock.clone());
    let log = Arc::default();
    let deadline = Instant::from_millis(799);
    let got = run_on(
        &clock,
        retry(rt.clone(), failing(&rt, &log))
            .backoff(doubling())
            .max_retries(100)
            .deadline(deadline)
            .seed(7)
            .into_future(),
    );
    assert!(matches!(
        got,
        Err(RetryError::Surfaced(Surfaced {
            reason: SurfaceReason::DeadlineExceeded,
            ..
        }))
    ));
    let log = log.lock().unwrap();
    let starts: Vec<u64> = log
        .iter()
        .map(|(at, _)| at.as_nanos() / 1_000_000)
        .collect();
    assert_eq!(starts, [0, 100, 300, 700]);
    assert!(log.iter().all(|(at, _)| *at < deadline));
    assert_eq!(clock.now(), Instant::from_millis(700));
    assert_eq!(clock.sleepers(), 0);
}

/// A `ManualClock` runtime whose timers wake 3 ms late, as a loaded real timer may.
#[derive(Clone)]
struct Late(ManualClock);

impl Runtime for Late {
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + 'static {
        self.0.sleep_until(at + Duration::from_millis(3))
    }
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, _: F) {
        unreachable!("the retry helper spawns nothing")
    }
}

#[test]
fn a_timer_that_wakes_past_the_deadline_starts_no_attempt() {
    // The retry is planned for 100 ms, before the 101 ms deadline; the timer wakes at 103 ms.
    let clock = ManualClock::new();
    let rt = Late(clock.clone());
    let log = Arc::default();
    let got = run_on(
        &clock,
        retry(rt.clone(), failing(&rt, &log))
            .backoff(fixed_100ms())
            .deadline(Instant::from_millis(101))
            .into_future(),
    );
    assert_eq!(
        got,
        Err(RetryError::Surfaced(Surfaced::new(
            Busy,
            SurfaceReason::DeadlineExceeded
        )))
    );
    assert_eq!(clock.now(), Instant::from_millis(103));
    assert_eq!(log.lock().unwrap().len(), 1, "no attempt at 103 ms");
    // With room for it, the late retry runs and is told what is really left.
    let clock = ManualClock::new();
    let rt = Late(clock.clone());
    let log = Arc::default();
    let _ = run_on(
        &clock,
        retry(rt.clone(), failing(&rt, &log))
            .backoff(fixed_100ms())
            .max_retries(1)
            .deadline(Instant::from_millis(150))
            .into_future(),
    );
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[1].0, Instant::from_millis(103));
    assert_eq!(log[1].1.time_left, Some(Duration::from_millis(47)));
}

#[test]
fn runs_on_async_std_with_its_real_clock() {
    let rt = throttle_async_std::AsyncStdRuntime::new();
    let tiny = BackoffConfig::builder()
        .initial(Duration::from_millis(1))
        .max(Duration::from_millis(2))
        .build()
        .unwrap();
    let got = async_std::task::block_on(
        retry(rt, |a| async move {
            if a.number < 3 {
                Err(Busy)
            } else {
                Ok(a.number)
            }
        })
        .backoff(tiny)
        .into_future(),
    );
    assert_eq!(got, Ok(3));
}

/// What a scripted operation returns on each attempt, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Throttled,
    TimedOut,
    Busy,
    Fatal,
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn when_cause_picks_the_backoff_and_the_price_of_each_retry() {
    use throttle_sansio::failover::{AwsRetryQuota, AwsRetryQuotaConfig, ErrorCause};
    // AWS SDKs, standard mode (the retry behaviour spec, "Retry quota"): 500 tokens, a retry
    // costs 5, one after a timeout 10. The 2026 revision's backoff: throttling errors from a
    // 1 s base, others from 50 ms (here unjittered, so the waits are exact).
    let quota = SharedBudget::new(AwsRetryQuota::new(AwsRetryQuotaConfig::aws_standard()));
    let transient = BackoffConfig::builder()
        .initial(Duration::from_millis(50))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    let throttling = BackoffConfig::builder()
        .initial(Duration::from_secs(1))
        .max(Duration::from_secs(20))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    let script = [
        Outcome::Throttled,
        Outcome::Busy,
        Outcome::Throttled,
        Outcome::TimedOut,
        Outcome::Fatal,
    ];
    let rt = TokioRuntime::new();
    let waits = Arc::new(Mutex::new(Vec::new()));
    let prices = Arc::new(Mutex::new(Vec::new()));
    let (w, p, q) = (Arc::clone(&waits), Arc::clone(&prices), quota.clone());
    let got = retry(rt.clone(), move |a: Attempt| {
        core::future::ready(Err::<(), _>(script[a.number as usize - 1]))
    })
    .backoff(transient)
    .throttling_backoff(throttling)
    .max_retries(10)
    .budget(&quota)
    .when_cause(|e: &Outcome| match e {
        Outcome::Throttled => Some(ErrorCause::Throttling),
        Outcome::TimedOut => Some(ErrorCause::Timeout),
        Outcome::Busy => Some(ErrorCause::Transient),
        Outcome::Fatal => None,
    })
    .notify(move |_: &Outcome, after| {
        w.lock().unwrap().push(after);
        p.lock().unwrap().push(q.with(|b| b.tokens()));
    })
    .await;
    assert!(
        matches!(
            got,
            Err(RetryError::Surfaced(Surfaced {
                error: Outcome::Fatal,
                reason: SurfaceReason::ClassifiedNever,
                ..
            }))
        ),
        "{got:?}"
    );
    // Each cause backs off on its own sequence: throttling 1 s then 2 s, transient 50 ms
    // then 100 ms (the timeout is transient's second step).
    assert_eq!(
        *waits.lock().unwrap(),
        [
            Duration::from_secs(1),
            Duration::from_millis(50),
            Duration::from_secs(2),
            Duration::from_millis(100),
        ]
    );
    // The quota after each withdrawal: 5 for throttling and a transient error, 10 after the
    // timeout.
    assert_eq!(*prices.lock().unwrap(), [495, 490, 485, 475]);
}
