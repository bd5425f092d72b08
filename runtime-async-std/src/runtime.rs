//! [`AsyncStdRuntime`]: the core's runtime seam on async-std.

use core::future::Future;

use throttle_sansio::Instant;
use throttle_sansio::sync::Runtime;
use throttle_sansio::time::StdEpoch;

/// The core timeline on the system's monotonic clock (a [`StdEpoch`] at the moment the runtime
/// value was made), async-std's timer and executor. Cheap to clone (`Copy`); clones share the epoch.
///
/// It needs no runtime context, unlike tokio's (`throttle_tokio::TokioRuntime::try_current`):
/// async-std's executor and timer are global and start on first use, so the value can be made,
/// and [`spawn`](Runtime::spawn) and [`sleep_until`](Self::sleep_until) called or polled, on
/// any thread, including a plain `std::thread` that runs no executor.
///
/// ```
/// use throttle_async_std::AsyncStdRuntime;
/// use throttle_async_std::sync::Runtime;
///
/// let rt = AsyncStdRuntime::new(); // no executor around this thread
/// let (tx, rx) = std::sync::mpsc::channel();
/// std::thread::spawn(move || rt.spawn(async move { tx.send(7).unwrap() }))
///     .join()
///     .unwrap();
/// assert_eq!(rx.recv(), Ok(7));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct AsyncStdRuntime {
    epoch: StdEpoch,
}

impl AsyncStdRuntime {
    /// A runtime whose epoch is now. Infallible, anywhere (see the type).
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
    /// Spawns on async-std's global executor, from any thread (it needs no context).
    ///
    /// # Panics
    ///
    /// Only if async-std cannot start its executor (it fails to spawn an OS thread), as
    /// `async_std::task::spawn` does; never for want of a runtime context.
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

    /// Polls `fut` to completion on this thread, with no executor around it.
    fn block_on_plain<F: Future>(fut: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut fut = core::pin::pin!(fut);
        loop {
            if let std::task::Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
            std::thread::park();
        }
    }

    #[test]
    fn spawn_and_sleep_need_no_context_on_a_plain_thread() {
        let rt = AsyncStdRuntime::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let slept = std::thread::spawn(move || {
            rt.spawn(async move { tx.send(7).unwrap() });
            // Polled by no executor: async-std's timer is global.
            let deadline = rt.now() + core::time::Duration::from_millis(1);
            block_on_plain(rt.sleep_until(deadline));
            rt.now() >= deadline
        })
        .join()
        .expect("neither spawn nor the sleep panicked on a plain thread");
        assert!(slept);
        assert_eq!(rx.recv(), Ok(7));
    }
}
