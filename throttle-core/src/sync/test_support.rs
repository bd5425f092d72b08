//! Hand-rolled wakers and a tiny executor for the `sync` tests (no executor crate in the core).
//!
//! Works under loom too: the counters are the shim's atomics, so a wake from another loom
//! thread is a tracked access.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::sync::Arc as StdArc;
use std::task::Wake;

use super::loom::atomic::{AtomicUsize, Ordering};

/// A waker that counts its wakes.
pub(crate) struct CountingWaker {
    wakes: AtomicUsize,
}

/// Reads a [`CountingWaker`]'s count.
#[derive(Clone)]
pub(crate) struct WakeCount(StdArc<CountingWaker>);

impl CountingWaker {
    // `Waker::from` needs std's `Arc`; the count inside it is the shim's atomic.
    #[allow(clippy::new_ret_no_self)]
    pub(crate) fn new() -> (Waker, WakeCount) {
        let inner = StdArc::new(CountingWaker {
            wakes: AtomicUsize::new(0),
        });
        (Waker::from(StdArc::clone(&inner)), WakeCount(inner))
    }
}

impl WakeCount {
    pub(crate) fn wakes(&self) -> usize {
        self.0.wakes.load(Ordering::SeqCst)
    }
}

impl Wake for CountingWaker {
    fn wake(self: StdArc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &StdArc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

/// Polls `future` once with `waker`.
pub(crate) fn poll_once<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

/// Re-polls `future` for as long as it has been woken since its last poll, asserting it stays
/// pending; afterwards it is asleep until its next wake (the loom models' "settle" step).
#[cfg(loom)]
pub(crate) fn repoll_while_woken<F: Future>(
    mut future: Pin<&mut F>,
    wakes: &WakeCount,
    cx: &mut Context<'_>,
) {
    let mut seen = 0;
    while wakes.wakes() != seen {
        seen = wakes.wakes();
        assert!(future.as_mut().poll(cx).is_pending());
    }
}

/// A task handed to [`Runtime::spawn`](super::Runtime::spawn).
pub(crate) type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs tasks on the calling thread, polling only those woken since their last poll.
#[cfg(not(loom))]
#[derive(Default)]
pub(crate) struct Executor {
    tasks: Vec<Option<(Task, Waker, WakeCount, usize)>>,
    spawned: StdArc<std::sync::Mutex<Vec<Task>>>,
}

#[cfg(not(loom))]
impl Executor {
    /// A spawner whose tasks this executor runs.
    pub(crate) fn spawner(&self) -> Spawner {
        Spawner(StdArc::clone(&self.spawned))
    }

    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.spawner().spawn(task);
    }

    /// Polls woken tasks (and new ones) until none is woken; returns how many are unfinished.
    pub(crate) fn run_until_stalled(&mut self) -> usize {
        loop {
            let new: Vec<Task> = match self.spawned.lock() {
                Ok(mut q) => q.drain(..).collect(),
                Err(_) => Vec::new(),
            };
            for task in new {
                let (waker, count) = CountingWaker::new();
                // `usize::MAX` as "seen" makes a new task look woken.
                self.tasks.push(Some((task, waker, count, usize::MAX)));
            }
            let mut progressed = false;
            for entry in &mut self.tasks {
                let Some((task, waker, count, seen)) = entry else {
                    continue;
                };
                let now = count.wakes();
                if now == *seen {
                    continue;
                }
                *seen = now;
                progressed = true;
                if task
                    .as_mut()
                    .poll(&mut Context::from_waker(waker))
                    .is_ready()
                {
                    *entry = None;
                }
            }
            let queued = self.spawned.lock().map_or(0, |q| q.len());
            if !progressed && queued == 0 {
                return self.tasks.iter().flatten().count();
            }
        }
    }
}

/// Sends tasks to an [`Executor`].
#[cfg(not(loom))]
#[derive(Clone)]
pub(crate) struct Spawner(StdArc<std::sync::Mutex<Vec<Task>>>);

#[cfg(not(loom))]
impl Spawner {
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        if let Ok(mut q) = self.0.lock() {
            q.push(Box::pin(task));
        }
    }
}

/// A [`Runtime`](super::Runtime) on a [`ManualClock`](super::ManualClock); spawned tasks go to
/// an [`Executor`] (dropped without one), or under loom to a queue the model empties with
/// [`take_spawned`](Self::take_spawned) and polls by hand, on whichever model thread it likes.
#[derive(Clone)]
pub(crate) struct TestRuntime {
    pub(crate) clock: super::ManualClock,
    #[cfg(not(loom))]
    pub(crate) spawner: Option<Spawner>,
    /// A std lock, not loom's: it is test plumbing, and no loom operation runs while it is
    /// held (a task is boxed before and dropped after), so loom's scheduler cannot block on
    /// it, and it adds no interleavings to the models.
    #[cfg(loom)]
    spawned: StdArc<std::sync::Mutex<Vec<Task>>>,
}

impl TestRuntime {
    pub(crate) fn new() -> Self {
        TestRuntime {
            clock: super::ManualClock::new(),
            #[cfg(not(loom))]
            spawner: None,
            #[cfg(loom)]
            spawned: StdArc::default(),
        }
    }

    /// The tasks spawned since the last call, oldest first.
    #[cfg(loom)]
    pub(crate) fn take_spawned(&self) -> Vec<Task> {
        match self.spawned.lock() {
            Ok(mut q) => core::mem::take(&mut *q),
            Err(_) => Vec::new(),
        }
    }
}

impl super::Runtime for TestRuntime {
    fn now(&self) -> crate::time::Instant {
        self.clock.now()
    }
    fn sleep_until(
        &self,
        deadline: crate::time::Instant,
    ) -> impl Future<Output = ()> + Send + 'static {
        self.clock.sleep_until(deadline)
    }
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        #[cfg(not(loom))]
        if let Some(s) = &self.spawner {
            s.spawn(future);
            return;
        }
        #[cfg(not(loom))]
        drop(future);
        #[cfg(loom)]
        {
            let task: Task = Box::pin(future);
            if let Ok(mut q) = self.spawned.lock() {
                q.push(task);
            }
        }
    }
}

/// A [`TestRuntime`] that runs its first task (a driver's) and refuses every later one: it
/// drops the task, then panics, as tokio's `spawn` does outside a runtime. `spawns` counts
/// the spawns asked for (std's atomic: these tests run outside loom).
#[cfg(not(loom))]
#[derive(Clone)]
pub(crate) struct RefusingRuntime {
    pub(crate) inner: TestRuntime,
    pub(crate) spawns: StdArc<std::sync::atomic::AtomicUsize>,
}

#[cfg(not(loom))]
impl RefusingRuntime {
    /// Spawns go to `exec` (the first one only).
    pub(crate) fn new(exec: &mut Executor) -> Self {
        let mut inner = TestRuntime::new();
        inner.spawner = Some(exec.spawner());
        RefusingRuntime {
            inner,
            spawns: StdArc::default(),
        }
    }
}

#[cfg(not(loom))]
impl super::Runtime for RefusingRuntime {
    fn now(&self) -> crate::time::Instant {
        self.inner.now()
    }
    fn sleep_until(
        &self,
        deadline: crate::time::Instant,
    ) -> impl Future<Output = ()> + Send + 'static {
        self.inner.sleep_until(deadline)
    }
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
        use std::sync::atomic::Ordering as StdOrdering;
        if self.spawns.fetch_add(1, StdOrdering::SeqCst) == 0 {
            self.inner.spawn(future);
        } else {
            drop(future);
            panic!("cannot spawn");
        }
    }
}

/// A test connector: connects at once (or fails for port 0), counting connects and the
/// connections alive (a [`FakeConn`] not yet dropped). The next connect panics if `hostile`
/// says so: [`CONNECT_PANICS`] in `connect()` itself, [`FUTURE_PANICS`] in its future, or
/// never ends ([`NEVER`]). Its counters are the loom shim's atomics, so under loom a thread
/// switch may fall just before a connection's drop.
#[derive(Default)]
pub(crate) struct FakeConnector {
    pub(crate) connects: StdArc<AtomicUsize>,
    pub(crate) live: StdArc<AtomicUsize>,
    pub(crate) hostile: StdArc<AtomicUsize>,
}

/// [`FakeConnector::hostile`]: the next `connect()` panics.
pub(crate) const CONNECT_PANICS: usize = 1;
/// [`FakeConnector::hostile`]: the next connect's future panics.
pub(crate) const FUTURE_PANICS: usize = 2;
/// [`FakeConnector::hostile`]: the next connect's future never ends.
pub(crate) const NEVER: usize = 3;

/// A [`FakeConnector`]'s connection: counted alive until dropped.
pub(crate) struct FakeConn(StdArc<AtomicUsize>);

impl Drop for FakeConn {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl super::Connector<u32> for FakeConnector {
    type Conn = FakeConn;
    type Error = &'static str;
    fn connect(
        &self,
        _host: &u32,
        port: u16,
        _attempt: crate::conn_key::ConnectAttempt,
    ) -> impl Future<Output = Result<FakeConn, &'static str>> + Send + 'static {
        self.connects.fetch_add(1, Ordering::SeqCst);
        let live = StdArc::clone(&self.live);
        let hostile = self.hostile.swap(0, Ordering::SeqCst);
        assert_ne!(hostile, CONNECT_PANICS, "connect() panics");
        async move {
            assert_ne!(hostile, FUTURE_PANICS, "the connect future panics");
            if hostile == NEVER {
                core::future::pending::<()>().await;
            }
            if port == 0 {
                return Err("refused");
            }
            live.fetch_add(1, Ordering::SeqCst);
            Ok(FakeConn(live))
        }
    }
}

/// A transport whose `send` is a closure of the batch's operations (the shard is not
/// looked at); `torn`: every batch error means a torn stream.
pub(crate) struct Sends<F> {
    send: F,
    torn: bool,
}

impl<F> Sends<F> {
    pub(crate) fn new(send: F) -> Self {
        Sends { send, torn: false }
    }

    #[cfg_attr(not(loom), allow(dead_code))] // the loom models' torn streams
    pub(crate) fn tearing(send: F) -> Self {
        Sends { send, torn: true }
    }
}

impl<F, R, K> super::Transport<K, u32> for Sends<F>
where
    F: Fn(Vec<u32>) -> R + Send + Sync + 'static,
    R: Future<Output = super::BatchOutcome<u32, &'static str>> + Send + 'static,
{
    type Output = u32;
    type Error = &'static str;
    fn send(
        &self,
        _shard: &K,
        ops: Vec<u32>,
    ) -> impl Future<Output = super::BatchOutcome<u32, &'static str>> + Send + 'static {
        (self.send)(ops)
    }
    fn torn(&self, _error: &&'static str) -> bool {
        self.torn
    }
}

/// A failover call through `fx` whose first attempt fails with `NotLeader` (so the call
/// refreshes, or joins the refresh in progress) and whose retry succeeds with the attempt
/// number.
pub(crate) fn failing_once(
    fx: &super::FailoverExecutor<
        TestRuntime,
        crate::failover::AdminWriteGateway,
        crate::failover::Unlimited,
    >,
) -> impl Future<Output = Result<u32, super::CallError<crate::failover::ErrorKind>>> + Send + 'static
{
    use crate::failover::ErrorKind;
    let fx = fx.clone();
    async move {
        let mut tries = 0;
        fx.call(
            move || {
                let n = tries;
                tries += 1;
                async move {
                    if n == 0 {
                        Err(ErrorKind::NotLeader)
                    } else {
                        Ok(n)
                    }
                }
            },
            || async { true },
        )
        .await
    }
}
