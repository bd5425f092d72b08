//! The two harnesses: a runtime and a way to move its time.

use core::future::Future;
use core::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::sync::{ManualClock, Runtime};

/// A runtime under test plus control of its time.
pub trait Harness {
    /// The runtime the scenario's handles use.
    type Rt: Runtime;
    /// The runtime.
    fn rt(&self) -> Self::Rt;
    /// Moves time forward by `by` and lets due timers fire.
    fn advance(&self, by: Duration) -> impl Future<Output = ()>;
    /// Gives other tasks a chance to run.
    fn yield_now(&self) -> impl Future<Output = ()>;
}

/// Yields until `cond` holds. Progress is by condition, not by time; the bound only turns a
/// hang (a bug) into a failure.
pub async fn until<H: Harness>(h: &H, what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1_000_000 {
        if cond() {
            return;
        }
        h.yield_now().await;
    }
    panic!("never happened: {what}");
}

/// tokio with paused time (the test is `start_paused`): `TokioRuntime` as is.
pub struct TokioPaused(throttle_tokio::TokioRuntime);

impl TokioPaused {
    pub fn new() -> Self {
        TokioPaused(throttle_tokio::TokioRuntime::new())
    }
}

impl Harness for TokioPaused {
    type Rt = throttle_tokio::TokioRuntime;
    fn rt(&self) -> Self::Rt {
        self.0.clone()
    }
    async fn advance(&self, by: Duration) {
        tokio::time::advance(by).await;
        // Let the tasks whose timers fired run before the scenario looks.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }
    async fn yield_now(&self) {
        tokio::task::yield_now().await;
    }
}

/// async-std's executor with the core's `ManualClock` as the clock: `now` and `sleep_until`
/// from the manual clock, `spawn` from async-std.
#[derive(Clone)]
pub struct ManualAsyncStd {
    clock: ManualClock,
}

impl Runtime for ManualAsyncStd {
    fn now(&self) -> Instant {
        self.clock.now()
    }
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
        self.clock.sleep_until(deadline)
    }
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // The real adapter's spawn, so tasks run on async-std's executor.
        throttle_async_std::AsyncStdRuntime::new().spawn(future);
    }
}

/// The async-std harness.
pub struct AsyncStdManual(ManualAsyncStd);

impl AsyncStdManual {
    pub fn new() -> Self {
        AsyncStdManual(ManualAsyncStd {
            clock: ManualClock::new(),
        })
    }
}

impl Harness for AsyncStdManual {
    type Rt = ManualAsyncStd;
    fn rt(&self) -> Self::Rt {
        self.0.clone()
    }
    async fn advance(&self, by: Duration) {
        self.0.clock.advance(by);
        for _ in 0..8 {
            async_std::task::yield_now().await;
        }
    }
    async fn yield_now(&self) {
        async_std::task::yield_now().await;
    }
}
