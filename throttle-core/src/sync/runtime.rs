//! The runtime seam: the three things an async runtime must give the concurrent layer, and a
//! manual clock for runtimes (and tests) without virtual time.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;

use smallvec::SmallVec;

use super::loom::{Arc, Mutex, lock};
use super::waiters::{WaiterKey, Waiters, wake_all};
use crate::time::Instant;

/// What the concurrent layer needs from an async runtime: a clock on the core's timeline,
/// sleeping until an instant, and spawning a task. Nothing else (no I/O, no channels).
///
/// Adapters implement it once (`throttle-tokio`, `throttle-async-std`); code that is generic over
/// `R: Runtime` (the gate handle's `wait_until_open`, the adapter conformance suite) then runs
/// on any of them. An implementation is a cheap handle (`Clone`), typically a copy of the
/// clock's epoch, about a hundred lines including its tests.
///
/// # Contract
///
/// - [`now`](Self::now) is monotonic: it never returns an instant earlier than one it returned
///   before. Its epoch is the implementation's choice (the moment it was built, say); every
///   instant the layer handles comes from the same `Runtime` value or one cloned from it.
/// - [`sleep_until`](Self::sleep_until) resolves once `now() >= deadline`, and at once for a
///   deadline already passed. A deadline the runtime cannot represent (`Instant::MAX`) never
///   resolves. The future is `Send + 'static` (it owns what it needs) and cancel-safe: dropping
///   it before it resolves has no effect. Waking early is allowed (callers re-check the time);
///   waking late is not, beyond the runtime's timer granularity.
/// - [`spawn`](Self::spawn) runs the future to completion in the background. It returns
///   nothing: the layer never joins a task, it communicates through its handles. A runtime
///   that cannot run it may drop it or panic (a `throttle_tokio::TokioRuntime::new` made and
///   used outside a tokio runtime; `TokioRuntime::try_current` refuses to make one): every future
///   the layer spawns owns what it must release in a guard, so a dropped one strands nothing.
///   Where a `spawn` panic goes is documented on each caller: `BatchDriver::new` panics with
///   it (under `# Panics`), `ConnPool::lease` too, and the driver's batch sends catch it (the
///   batch fails, its credit comes back).
///
/// A runtime without virtual time (async-std) can take its clock from a [`ManualClock`] in
/// tests, so one conformance suite is deterministic on every runtime.
///
/// ```
/// use core::future::Future;
/// use throttle_sansio::Instant;
/// use throttle_sansio::sync::{ManualClock, Runtime};
///
/// /// A runtime whose time is a manual clock and whose tasks go to a caller's queue.
/// #[derive(Clone)]
/// struct Manual {
///     clock: ManualClock,
/// }
///
/// impl Runtime for Manual {
///     fn now(&self) -> Instant {
///         self.clock.now()
///     }
///     fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
///         self.clock.sleep_until(deadline)
///     }
///     fn spawn<F>(&self, future: F)
///     where
///         F: Future<Output = ()> + Send + 'static,
///     {
///         drop(future); // a real runtime hands it to its executor
///     }
/// }
///
/// let rt = Manual { clock: ManualClock::new() };
/// rt.clock.advance(core::time::Duration::from_millis(5));
/// assert_eq!(rt.now(), Instant::from_millis(5));
/// ```
pub trait Runtime: Clone + Send + Sync + 'static {
    /// The current instant on the core timeline (monotonic).
    fn now(&self) -> Instant;

    /// A future that resolves once [`now`](Self::now) has reached `deadline`.
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static;

    /// Runs `future` to completion in the background.
    ///
    /// # Panics
    ///
    /// An implementation may panic when it cannot run tasks at all (see the contract above);
    /// it must not panic for any other reason.
    fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static;
}

/// A clock that moves only when told to, with sleepers that wake when it passes their deadline.
///
/// It is the injected clock for runtimes without paused time (async-std in the conformance
/// suite) and for the core's own tests. Clones share the same time.
///
/// - [`advance`](Self::advance) / [`advance_to`](Self::advance_to) move time forward (never
///   back: an earlier instant is ignored) and wake every sleeper whose deadline has passed,
///   after the clock's lock is dropped.
/// - [`sleep_until`](Self::sleep_until) gives a [`ManualSleep`]; dropping it unregisters it.
/// - [`next_deadline`](Self::next_deadline) lets a test driver jump straight to the next
///   timer, the way tokio's paused time auto-advances.
#[derive(Clone)]
pub struct ManualClock {
    shared: Arc<Mutex<ClockState>>,
}

struct ClockState {
    now: Instant,
    /// Registered sleepers' deadlines, at `ManualSleep::slot`.
    sleepers: Waiters<Instant>,
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish_non_exhaustive()
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A clock at [`Instant::ZERO`].
    pub fn new() -> Self {
        Self::starting_at(Instant::ZERO)
    }

    /// A clock at `now`.
    pub fn starting_at(now: Instant) -> Self {
        ManualClock {
            shared: Arc::new(Mutex::new(ClockState {
                now,
                sleepers: Waiters::new(),
            })),
        }
    }

    /// The clock's current instant.
    pub fn now(&self) -> Instant {
        lock(&self.shared).now
    }

    /// Moves time forward by `by` (saturating at [`Instant::MAX`]) and wakes due sleepers, as
    /// [`advance_to`](Self::advance_to) (never panics).
    pub fn advance(&self, by: Duration) {
        let to = self.now() + by;
        self.advance_to(to);
    }

    /// Moves time forward to `to` (an earlier instant leaves the clock where it is) and wakes
    /// every sleeper whose deadline is at or before the new time. Never panics: a sleeper's
    /// waker that panics in `wake` is caught, and the other due sleepers are still woken.
    pub fn advance_to(&self, to: Instant) {
        let mut due = SmallVec::<[Waker; 4]>::new();
        {
            let mut st = lock(&self.shared);
            st.now = st.now.max(to);
            let now = st.now;
            st.sleepers
                .wake_where(&mut due, |deadline| *deadline <= now);
        }
        wake_all(due);
    }

    /// The earliest deadline among registered sleepers that has not passed yet.
    pub fn next_deadline(&self) -> Option<Instant> {
        let st = lock(&self.shared);
        st.sleepers.states().copied().filter(|d| *d > st.now).min()
    }

    /// Sleepers registered (polled at least once, not yet resolved or dropped).
    pub fn sleepers(&self) -> usize {
        lock(&self.shared).sleepers.len()
    }

    /// A future resolving once the clock reaches `deadline` (at once if it has). Its poll may
    /// panic in the waker's `clone` (see [`ManualSleep`]).
    pub fn sleep_until(&self, deadline: Instant) -> ManualSleep {
        ManualSleep {
            shared: Arc::clone(&self.shared),
            deadline,
            slot: None,
        }
    }
}

/// The future of [`ManualClock::sleep_until`]. Cancel-safe: dropping it unregisters it.
///
/// # Panics
///
/// A poll panics only if the waker's `clone` panics, as it registers the sleeper (no other
/// user code runs). It is then not registered (no sleeper, no
/// [`next_deadline`](ManualClock::next_deadline) of its own): polling it again registers it,
/// and it wakes at its deadline.
#[must_use = "futures do nothing unless polled"]
pub struct ManualSleep {
    shared: Arc<Mutex<ClockState>>,
    deadline: Instant,
    slot: Option<WaiterKey>,
}

impl fmt::Debug for ManualSleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualSleep")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl ManualSleep {
    /// The instant this sleep waits for.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut st = lock(&this.shared);
        let (deadline, done) = (this.deadline, st.now >= this.deadline);
        st.sleepers
            .poll_wait(&mut this.slot, done, cx.waker(), || deadline)
    }
}

impl Drop for ManualSleep {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            lock(&self.shared).sleepers.remove(slot);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::{CountingWaker, poll_once};

    #[test]
    fn sleeper_wakes_when_the_clock_reaches_its_deadline_and_not_before() {
        let clock = ManualClock::new();
        let (waker, count) = CountingWaker::new();
        let mut sleep = clock.sleep_until(Instant::from_millis(10));
        assert!(poll_once(&mut sleep, &waker).is_pending());
        assert_eq!(clock.next_deadline(), Some(Instant::from_millis(10)));
        clock.advance(Duration::from_millis(9));
        assert_eq!(count.wakes(), 0, "1 ms early: no wake");
        assert!(poll_once(&mut sleep, &waker).is_pending());
        clock.advance(Duration::from_millis(1));
        assert_eq!(count.wakes(), 1);
        assert!(poll_once(&mut sleep, &waker).is_ready());
        assert_eq!(clock.sleepers(), 0);
    }

    #[test]
    fn time_never_moves_back_and_saturates_at_max() {
        let clock = ManualClock::starting_at(Instant::from_millis(5));
        clock.advance_to(Instant::from_millis(1));
        assert_eq!(clock.now(), Instant::from_millis(5));
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), Instant::MAX);
        let (waker, _) = CountingWaker::new();
        assert!(poll_once(&mut clock.sleep_until(Instant::MAX), &waker).is_ready());
    }

    #[test]
    fn a_sleeper_whose_waker_panics_does_not_keep_the_others_asleep() {
        let clock = ManualClock::new();
        let (bad, bad_wakes) = crate::sync::panic_support::PanickingWaker::new();
        let (good, good_wakes) = CountingWaker::new();
        let mut first = clock.sleep_until(Instant::from_millis(1));
        let mut second = clock.sleep_until(Instant::from_millis(1));
        assert!(poll_once(&mut first, &bad).is_pending());
        assert!(poll_once(&mut second, &good).is_pending());
        let advanced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            clock.advance(Duration::from_millis(1))
        }));
        assert!(advanced.is_ok(), "advance returns normally");
        assert_eq!((bad_wakes.wakes(), good_wakes.wakes()), (1, 1));
        assert!(poll_once(&mut second, &good).is_ready());
        assert!(poll_once(&mut first, &good).is_ready());
        assert_eq!(clock.sleepers(), 0);
    }

    #[test]
    fn dropped_sleeper_is_unregistered() {
        let clock = ManualClock::new();
        let (waker, count) = CountingWaker::new();
        let mut a = clock.sleep_until(Instant::from_millis(3));
        let mut b = clock.sleep_until(Instant::from_millis(7));
        assert!(poll_once(&mut a, &waker).is_pending());
        assert!(poll_once(&mut b, &waker).is_pending());
        drop(a);
        assert_eq!(clock.sleepers(), 1);
        assert_eq!(clock.next_deadline(), Some(Instant::from_millis(7)));
        clock.advance(Duration::from_millis(5));
        assert_eq!(count.wakes(), 0, "the dropped sleeper is not woken");
        drop(b);
        assert_eq!((clock.sleepers(), clock.next_deadline()), (0, None));
    }
}
