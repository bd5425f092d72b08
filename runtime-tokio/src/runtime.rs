//! [`TokioRuntime`]: the core's runtime seam on tokio.

use core::future::Future;
use core::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::sync::Runtime;
use tokio::runtime::Handle;

/// The core timeline on tokio's clock (nanoseconds since the runtime value was made), tokio's
/// timer and tokio's executor. Cheap to clone; clones share the epoch.
///
/// Time comes from `tokio::time::Instant`, so paused time (`start_paused`,
/// `tokio::time::advance`) drives every machine and handle of the core.
#[derive(Debug, Clone)]
pub struct TokioRuntime {
    epoch: tokio::time::Instant,
    handle: Option<Handle>,
}

impl TokioRuntime {
    /// A runtime whose epoch is now; it spawns on the tokio runtime it is created in (or, made
    /// outside one, on the runtime current at each `spawn`).
    ///
    /// Made outside a tokio runtime, its [`spawn`](Runtime::spawn) panics when called outside
    /// one too; so does everything that spawns through it there (`BatchDriver::new`,
    /// `ConnPool::lease`). Use [`with_handle`](Self::with_handle) to spawn from anywhere.
    pub fn new() -> Self {
        TokioRuntime {
            epoch: tokio::time::Instant::now(),
            handle: Handle::try_current().ok(),
        }
    }

    /// A runtime spawning on `handle`.
    pub fn with_handle(handle: Handle) -> Self {
        TokioRuntime {
            epoch: tokio::time::Instant::now(),
            handle: Some(handle),
        }
    }

    /// The current instant on the core timeline ([`Runtime::now`], callable without the
    /// trait in scope).
    pub fn now(&self) -> Instant {
        let since = tokio::time::Instant::now().saturating_duration_since(self.epoch);
        Instant::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Resolves once [`now`](Self::now) reaches `deadline`, at once if it has passed, never for
    /// a deadline tokio cannot represent ([`Runtime::sleep_until`]). Cancel-safe.
    pub fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
        let rt = self.clone();
        async move {
            let Some(at) = rt.tokio_instant(deadline) else {
                return core::future::pending().await;
            };
            // The clock decides expiry, not the timer: re-arm if it fired early.
            while rt.now() < deadline {
                tokio::time::sleep_until(at).await;
            }
        }
    }

    /// The tokio instant of a core instant (`None` beyond what tokio can represent).
    fn tokio_instant(&self, at: Instant) -> Option<tokio::time::Instant> {
        self.epoch.checked_add(Duration::from_nanos(at.as_nanos()))
    }
}

impl Default for TokioRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl Runtime for TokioRuntime {
    fn now(&self) -> Instant {
        TokioRuntime::now(self)
    }

    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
        TokioRuntime::sleep_until(self, deadline)
    }

    /// Spawns on the handle, or on the current tokio runtime for a `TokioRuntime` made outside
    /// one.
    ///
    /// # Panics
    ///
    /// Made outside a tokio runtime ([`TokioRuntime::new`]) and called outside one, as
    /// `tokio::spawn` does. The future is dropped first, so what it owned is released.
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // Fire and forget: the join handle is dropped, the task keeps running.
        drop(match &self.handle {
            Some(handle) => handle.spawn(future),
            None => tokio::spawn(future),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn paused_time_drives_the_core_clock_and_sleeps_end_on_the_deadline() {
        let rt = TokioRuntime::new();
        assert_eq!(rt.now(), Instant::ZERO);
        rt.sleep_until(Instant::from_millis(250)).await;
        assert_eq!(rt.now(), Instant::from_millis(250));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(rt.now(), Instant::from_millis(1_250));
        rt.sleep_until(Instant::ZERO).await; // passed: at once
        assert_eq!(rt.now(), Instant::from_millis(1_250));
    }

    #[tokio::test(start_paused = true)]
    async fn spawned_tasks_run_on_the_current_runtime() {
        let rt = TokioRuntime::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        rt.spawn(async move {
            let _ = tx.send(7);
        });
        assert_eq!(rx.await, Ok(7));
    }
}
