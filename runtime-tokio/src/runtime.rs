//! [`TokioRuntime`]: the core's runtime seam on tokio.

use core::fmt;
use core::future::Future;
use core::time::Duration;

use throttle_sansio::Instant;
use throttle_sansio::sync::Runtime;
use tokio::runtime::{Handle, TryCurrentError};

/// The core timeline on tokio's clock (nanoseconds since the runtime value was made), tokio's
/// timer and tokio's executor. Cheap to clone; clones share the epoch and the handle.
///
/// Time comes from `tokio::time::Instant`, so paused time (`start_paused`,
/// `tokio::time::advance`) drives every machine and handle of the core.
///
/// # Which tokio runtime it uses
///
/// A value made inside a tokio runtime ([`try_current`](Self::try_current),
/// [`new`](Self::new)) or from a [`Handle`] ([`with_handle`](Self::with_handle)) keeps that
/// runtime's handle: its [`spawn`](Runtime::spawn) and [`sleep_until`](Self::sleep_until)
/// then work from any thread, a plain `std::thread` included, for as long as that runtime
/// runs. Only a value that [`new`](Self::new) made outside any tokio runtime holds no handle;
/// it uses the runtime current at each call, and panics where there is none. Prefer
/// [`try_current`](Self::try_current), which refuses to make such a value:
///
/// ```
/// use throttle_tokio::{NoRuntime, TokioRuntime};
/// use throttle_tokio::sync::Runtime;
///
/// // Outside a tokio runtime: an error, not a value that panics later.
/// let err: NoRuntime = TokioRuntime::try_current().unwrap_err();
/// assert!(std::error::Error::source(&err).is_some()); // tokio's own error
///
/// let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
/// let rt = tokio.block_on(async { TokioRuntime::try_current() }).expect("inside a runtime");
/// let (tx, rx) = std::sync::mpsc::channel();
/// std::thread::spawn(move || rt.spawn(async move { tx.send(7).unwrap() })) // a plain thread
///     .join()
///     .unwrap();
/// assert_eq!(rx.recv(), Ok(7));
/// ```
#[derive(Debug, Clone)]
pub struct TokioRuntime {
    epoch: tokio::time::Instant,
    handle: Option<Handle>,
}

/// [`TokioRuntime::try_current`] was called outside a tokio runtime's context. The cause is tokio's [`TryCurrentError`], through
/// [`source`](std::error::Error::source).
///
/// ```
/// use throttle_tokio::TokioRuntime;
///
/// let err = TokioRuntime::try_current().unwrap_err();
/// assert_eq!(err.to_string(), "no tokio runtime to build a TokioRuntime on");
/// assert!(std::error::Error::source(&err).is_some());
/// ```
#[derive(Debug)]
pub struct NoRuntime {
    source: TryCurrentError,
}

impl fmt::Display for NoRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no tokio runtime to build a TokioRuntime on")
    }
}

impl std::error::Error for NoRuntime {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl TokioRuntime {
    /// A runtime whose epoch is now, spawning and sleeping on the tokio runtime this is called
    /// in, from any thread afterwards; [`NoRuntime`] outside a tokio runtime. The fallible
    /// form of [`new`](Self::new).
    pub fn try_current() -> Result<Self, NoRuntime> {
        match Handle::try_current() {
            Ok(handle) => Ok(Self::with_handle(handle)),
            Err(source) => Err(NoRuntime { source }),
        }
    }

    /// A runtime whose epoch is now. Inside a tokio runtime it keeps that runtime's handle, as
    /// [`try_current`](Self::try_current) does; outside one it keeps none and uses the tokio
    /// runtime current at each [`spawn`](Runtime::spawn) and [`sleep_until`](Self::sleep_until).
    ///
    /// # Panics
    ///
    /// Never itself. But a value made outside a tokio runtime panics later, in
    /// [`spawn`](Runtime::spawn) and in the first poll of [`sleep_until`](Self::sleep_until),
    /// when those run outside one too; so does everything that spawns through it there
    /// (`BatchDriver::new`, `ConnPool::lease`). [`try_current`](Self::try_current) returns an
    /// error instead; [`with_handle`](Self::with_handle) works from anywhere.
    pub fn new() -> Self {
        Self::try_current().unwrap_or_else(|_| TokioRuntime {
            epoch: tokio::time::Instant::now(),
            handle: None,
        })
    }

    /// A runtime whose epoch is now, spawning and sleeping on `handle`'s runtime from any
    /// thread.
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
    /// a deadline tokio cannot represent ([`Runtime::sleep_until`]). Cancel-safe. The timer is
    /// the held runtime's (see the type), so the future may be polled by any executor.
    ///
    /// # Panics
    ///
    /// When polled with a deadline not yet reached, as `tokio::time::sleep_until` does: for a
    /// value that holds no handle ([`new`](Self::new) outside a runtime) polled outside a tokio
    /// runtime; for a runtime built without its timer (`enable_time`); and for one whose timer
    /// has shut down.
    pub fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
        let rt = self.clone();
        async move {
            let Some(at) = rt.tokio_instant(deadline) else {
                return core::future::pending().await;
            };
            // The clock decides expiry, not the timer: re-arm if it fired early.
            while rt.now() < deadline {
                let sleep = {
                    // The timer registers with the runtime entered here, whoever polls.
                    let _entered = rt.handle.as_ref().map(Handle::enter);
                    tokio::time::sleep_until(at)
                };
                sleep.await;
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

    /// Spawns on the held runtime from any thread, or, for a value that holds none
    /// ([`TokioRuntime::new`] outside a runtime), on the tokio runtime current here. On a held
    /// runtime that has shut down, tokio drops the future at once (nothing runs, nothing
    /// panics).
    ///
    /// # Panics
    ///
    /// Only for a value that holds no handle, called outside a tokio runtime, as
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

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

    /// Sets its flag when dropped: whether a spawned future was run or released.
    struct Dropped(Arc<AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn multi_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Polls `fut` to completion on this thread, with no async runtime around it.
    fn block_on_plain<F: Future>(fut: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
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
    fn try_current_outside_a_runtime_is_an_error_with_tokios_as_its_source() {
        let err = TokioRuntime::try_current().expect_err("no runtime here");
        assert_eq!(
            err.to_string(),
            "no tokio runtime to build a TokioRuntime on"
        );
        let source = std::error::Error::source(&err).expect("tokio's error");
        assert!(source.downcast_ref::<TryCurrentError>().is_some());
    }

    #[test]
    fn a_runtime_captured_inside_spawns_and_sleeps_from_a_plain_thread() {
        let tokio = multi_thread();
        for rt in [
            tokio
                .block_on(async { TokioRuntime::try_current() })
                .unwrap(),
            tokio.block_on(async { TokioRuntime::new() }),
            TokioRuntime::with_handle(tokio.handle().clone()),
        ] {
            let (tx, rx) = std::sync::mpsc::channel();
            let slept = std::thread::spawn(move || {
                rt.spawn(async move { tx.send(7).unwrap() });
                // Polled by no tokio executor: the timer is still the captured runtime's.
                let deadline = rt.now() + Duration::from_millis(1);
                block_on_plain(rt.sleep_until(deadline));
                rt.now() >= deadline
            })
            .join()
            .expect("neither spawn nor the sleep panicked on a plain thread");
            assert!(slept);
            assert_eq!(rx.recv(), Ok(7));
        }
    }

    #[test]
    fn made_outside_a_runtime_spawn_panics_outside_one_and_releases_the_future() {
        let rt = TokioRuntime::new(); // holds no handle
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Dropped(Arc::clone(&dropped));
        let spawned = std::panic::catch_unwind(|| {
            rt.spawn(async move {
                let _guard = guard;
            })
        });
        assert!(spawned.is_err(), "tokio::spawn outside a runtime panics");
        assert!(dropped.load(Ordering::SeqCst), "the future was released");
        // Inside a runtime, the same value spawns there.
        let tokio = multi_thread();
        let (tx, rx) = std::sync::mpsc::channel();
        tokio.block_on(async { rt.spawn(async move { tx.send(7).unwrap() }) });
        assert_eq!(rx.recv(), Ok(7));
    }

    #[test]
    fn made_outside_a_runtime_a_sleep_panics_when_polled_outside_one() {
        let rt = TokioRuntime::new();
        let deadline = rt.now() + Duration::from_secs(1);
        let polled = std::panic::catch_unwind(|| block_on_plain(rt.sleep_until(deadline)));
        assert!(polled.is_err());
        // A passed deadline needs no timer.
        block_on_plain(rt.sleep_until(Instant::ZERO));
    }

    #[test]
    fn a_sleep_panics_on_a_runtime_without_its_timer() {
        let no_timer = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let rt = TokioRuntime::with_handle(no_timer.handle().clone());
        let deadline = rt.now() + Duration::from_secs(1);
        let polled = std::panic::catch_unwind(|| block_on_plain(rt.sleep_until(deadline)));
        assert!(polled.is_err());
    }

    #[test]
    fn a_runtime_shut_down_drops_what_is_spawned_on_it_without_a_panic() {
        let tokio = multi_thread();
        let rt = TokioRuntime::with_handle(tokio.handle().clone());
        drop(tokio);
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Dropped(Arc::clone(&dropped));
        rt.spawn(async move {
            let _guard = guard;
        });
        assert!(dropped.load(Ordering::SeqCst), "released, not run");
        let deadline = rt.now() + Duration::from_secs(1);
        let polled = std::panic::catch_unwind(|| block_on_plain(rt.sleep_until(deadline)));
        assert!(polled.is_err(), "its timer has shut down");
    }
}
