//! [`AsyncStdRuntime`]: the core's runtime seam on async-std.

use core::future::Future;

use throttle_sansio::Instant;
use throttle_sansio::sync::Runtime;
use throttle_sansio::time::StdEpoch;

/// The core timeline on the system's monotonic clock (a [`StdEpoch`] at the moment the runtime
/// value was made), async-std's timer and executor. Cheap to clone (`Copy`); clones share the epoch.
#[derive(Debug, Clone, Copy)]
pub struct AsyncStdRuntime {
    epoch: StdEpoch,
}

impl AsyncStdRuntime {
    /// A runtime whose epoch is now.
    pub fn new() -> Self {
        AsyncStdRuntime {
            epoch: StdEpoch::new(),
        }
    }
}

impl Default for AsyncStdRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl Runtime for AsyncStdRuntime {
    /// Spawns on async-std's global executor.
    ///
    /// # Panics
    ///
    /// If async-std cannot start its executor (it fails to spawn an OS thread), as
    /// `async_std::task::spawn` does.
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // Dropping an async-std join handle detaches the task; it keeps running.
        drop(async_std::task::spawn(future));
    }

    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
        AsyncStdRuntime::sleep_until(self, deadline)
    }

    fn now(&self) -> Instant {
        AsyncStdRuntime::now(self)
    }
}

impl AsyncStdRuntime {
    /// The current instant on the core timeline ([`Runtime::now`], callable without the
    /// trait in scope).
    pub fn now(&self) -> Instant {
        self.epoch.now()
    }

    /// Resolves once [`now`](Self::now) reaches `deadline`, at once if it has passed
    /// ([`Runtime::sleep_until`]). Cancel-safe.
    pub fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
        let rt = *self;
        async move {
            // The clock decides expiry, not the timer: sleep again for what is left. A deadline
            // past what `std::time::Instant` can hold gives a timer that never fires.
            loop {
                let left = deadline.saturating_duration_since(rt.now());
                if left.is_zero() {
                    return;
                }
                async_std::task::sleep(left).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passed_deadline_resolves_at_once_and_the_clock_never_runs_back() {
        let rt = AsyncStdRuntime::new();
        let before = rt.now();
        async_std::task::block_on(rt.sleep_until(Instant::ZERO));
        assert!(rt.now() >= before);
    }

    #[test]
    fn spawned_tasks_run_on_the_async_std_executor() {
        let rt = AsyncStdRuntime::new();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let _ = tx.send(7);
        });
        assert_eq!(rx.recv(), Ok(7));
    }
}
