//! [`WakeSignal`]: a broadcast "something moved earlier, look again" for sleepers.
//!
//! A sleeper that waits for a machine's deadline (the write gate's opening, a coalesced
//! refresh) arms a timer for the deadline it read. When an input moves that deadline earlier
//! (`GateAction::Wake`), the timer is now too late; the input's handler calls
//! [`notify`](WakeSignal::notify), and every sleeper re-reads the machine and re-arms.
//!
//! The signal is an epoch counter plus the wakers of the current listeners. The rule that makes
//! it race-free: **read the epoch before reading the machine**, then wait for
//! [`changed(epoch)`](WakeSignal::changed) alongside the timer. A notify that lands after the
//! read of the epoch (even before the listener is polled) makes `changed` ready at once, so no
//! update between "read the deadline" and "start listening" is missed.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use smallvec::SmallVec;

use super::Runtime;
use super::loom::{Arc, Mutex, lock};
use super::waiters::{WaiterKey, Waiters, wake_all};
use crate::time::Instant;

struct SignalState {
    epoch: u64,
    /// Pending listeners, at `Changed::slot`; a listener has no state of its own.
    listeners: Waiters<()>,
}

/// A cloneable broadcast signal: [`notify`](Self::notify) wakes every pending
/// [`changed`](Self::changed) listener. `Clone + Send + Sync`; clones share one signal.
///
/// ```
/// use throttle_sansio::sync::WakeSignal;
///
/// let signal = WakeSignal::new();
/// let seen = signal.epoch(); // 1. read the epoch, 2. then read the deadline
/// signal.notify(); // an input moved the deadline earlier
/// assert!(signal.has_changed(seen)); // so the listener for `seen` is ready at once
/// ```
#[derive(Clone)]
pub struct WakeSignal {
    shared: Arc<Mutex<SignalState>>,
}

impl fmt::Debug for WakeSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeSignal")
            .field("epoch", &self.epoch())
            .finish_non_exhaustive()
    }
}

impl Default for WakeSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl WakeSignal {
    /// A signal at epoch 0 with no listener.
    pub fn new() -> Self {
        WakeSignal {
            shared: Arc::new(Mutex::new(SignalState {
                epoch: 0,
                listeners: Waiters::new(),
            })),
        }
    }

    /// The current epoch. Read it *before* reading the state the signal guards.
    pub fn epoch(&self) -> u64 {
        lock(&self.shared).epoch
    }

    /// Whether [`notify`](Self::notify) was called since `epoch` was read.
    pub fn has_changed(&self, epoch: u64) -> bool {
        lock(&self.shared).epoch != epoch
    }

    /// Moves to the next epoch and wakes every pending listener (after the lock is dropped).
    /// Never panics: a listener's waker that panics in `wake` is caught, and the others are
    /// still woken.
    pub fn notify(&self) {
        let mut wakeups = SmallVec::<[Waker; 4]>::new();
        {
            let mut st = lock(&self.shared);
            st.epoch = st.epoch.wrapping_add(1);
            st.listeners.wake_where(&mut wakeups, |()| true);
        }
        wake_all(wakeups);
    }

    /// [`notify`](Self::notify) if `cond` holds: a handle announces "closed and drained" this
    /// way from each path that may end the last thing in flight.
    pub(crate) fn notify_if(&self, cond: bool) {
        if cond {
            self.notify();
        }
    }

    /// A future resolving once the epoch differs from `since` (at once if it already does).
    /// Cancel-safe: dropping it unregisters it. Its poll may panic in the waker's `clone` (see
    /// [`Changed`]).
    pub fn changed(&self, since: u64) -> Changed {
        Changed {
            shared: Arc::clone(&self.shared),
            since,
            slot: None,
        }
    }

    /// Listeners registered (polled, pending).
    pub fn listeners(&self) -> usize {
        lock(&self.shared).listeners.len()
    }
}

/// The future of [`WakeSignal::changed`].
///
/// # Panics
///
/// A poll panics only if the waker's `clone` panics, as it registers as a listener (no other
/// user code runs). It is then not registered (the signal is unchanged): polling it again
/// registers it, and dropping it is safe.
#[must_use = "futures do nothing unless polled"]
pub struct Changed {
    shared: Arc<Mutex<SignalState>>,
    since: u64,
    slot: Option<WaiterKey>,
}

impl fmt::Debug for Changed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changed")
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

impl Future for Changed {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut st = lock(&this.shared);
        let done = st.epoch != this.since;
        st.listeners
            .poll_wait(&mut this.slot, done, cx.waker(), || ())
    }
}

impl Drop for Changed {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            lock(&self.shared).listeners.remove(slot);
        }
    }
}

/// Sleeps until `next` says the wait is over, re-arming the timer whenever `signal` fires.
///
/// `next(now)` reads the guarded machine: `None` ends the wait, `Some(at)` sleeps until `at` on
/// `rt`'s clock or until `signal` is notified, whichever comes first, then asks again. The
/// epoch is read before each call to `next`, so a deadline moved earlier between that call and
/// the start of the sleep still wakes the sleeper (see the module docs). A `next` that keeps
/// answering an instant already passed is asked again at once, after a yield through the
/// runtime's sleep (which resolves immediately for a past deadline).
///
/// The returned future is `Send` when `F` is, and cancel-safe: dropping it drops its timer and
/// its listener.
///
/// # Panics
///
/// A poll panics if `next` panics, if the runtime's `now` or its sleep panics (a
/// `throttle_tokio::TokioRuntime::new` made and polled outside a tokio runtime), or if the
/// waker's `clone` panics as the sleep or the listener registers it. The signal is unchanged,
/// and dropping the future removes its timer and its listener.
pub async fn wait_until<R, F>(rt: &R, signal: &WakeSignal, mut next: F)
where
    R: Runtime,
    F: FnMut(Instant) -> Option<Instant>,
{
    loop {
        let epoch = signal.epoch();
        let Some(at) = next(rt.now()) else {
            return;
        };
        sleep_or_changed(rt, at, &mut signal.changed(epoch)).await;
    }
}

/// Sleeps until `at` on `rt`'s clock or until `changed` resolves, whichever comes first.
pub(crate) async fn sleep_or_changed<R: Runtime>(rt: &R, at: Instant, changed: &mut Changed) {
    let mut sleep = core::pin::pin!(rt.sleep_until(at));
    core::future::poll_fn(|cx| {
        // Poll both, so both hold this task's waker.
        let timer = sleep.as_mut().poll(cx).is_ready();
        let moved = Pin::new(&mut *changed).poll(cx).is_ready();
        if timer || moved {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// Waits until `done()` holds, asking it again only after `signal` is notified: the wait of
/// a handle's `closed()`, whose release paths notify once the handle is closed and drained.
///
/// The epoch is read before each call to `done` (the module's rule), so a notify that lands
/// between the check and the start of listening still ends the wait. Cancel-safe: dropping the
/// future drops its listener.
pub(crate) async fn wait_for(signal: &WakeSignal, mut done: impl FnMut() -> bool) {
    loop {
        let epoch = signal.epoch();
        if done() {
            return;
        }
        signal.changed(epoch).await;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::{CountingWaker, poll_once};

    #[test]
    fn notify_wakes_every_pending_listener_once() {
        let signal = WakeSignal::new();
        let seen = signal.epoch();
        let (wa, ca) = CountingWaker::new();
        let (wb, cb) = CountingWaker::new();
        let mut a = signal.changed(seen);
        let mut b = signal.changed(seen);
        assert!(poll_once(&mut a, &wa).is_pending());
        assert!(poll_once(&mut b, &wb).is_pending());
        assert_eq!(signal.listeners(), 2);
        signal.notify();
        assert_eq!((ca.wakes(), cb.wakes()), (1, 1));
        assert!(poll_once(&mut a, &wa).is_ready());
        assert!(poll_once(&mut b, &wb).is_ready());
        assert_eq!(signal.listeners(), 0);
        signal.notify();
        assert_eq!(
            (ca.wakes(), cb.wakes()),
            (1, 1),
            "finished listeners stay quiet"
        );
    }

    #[test]
    fn notify_before_the_first_poll_is_not_lost() {
        let signal = WakeSignal::new();
        let seen = signal.epoch();
        signal.notify();
        let (w, _) = CountingWaker::new();
        assert!(poll_once(&mut signal.changed(seen), &w).is_ready());
        assert!(poll_once(&mut signal.changed(signal.epoch()), &w).is_pending());
    }

    #[test]
    fn dropped_listener_is_unregistered_and_not_woken() {
        let signal = WakeSignal::new();
        let (w, c) = CountingWaker::new();
        let mut a = signal.changed(signal.epoch());
        assert!(poll_once(&mut a, &w).is_pending());
        drop(a);
        assert_eq!(signal.listeners(), 0);
        signal.notify();
        assert_eq!(c.wakes(), 0);
    }
}

#[cfg(all(test, not(loom)))]
mod wait_tests {
    use super::*;
    use crate::sync::test_support::{Executor, TestRuntime};
    use core::time::Duration;
    use std::sync::Mutex as StdMutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn is_send<T: Send>(_: &T) {}

    #[test]
    fn sleeper_rearms_when_the_deadline_moves_earlier_and_wakes_there() {
        let mut ex = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(ex.spawner());
        let signal = WakeSignal::new();
        // A stand-in for a gated bucket: closed until the deadline.
        let opening = std::sync::Arc::new(StdMutex::new(Instant::from_millis(100)));
        let done = std::sync::Arc::new(AtomicBool::new(false));
        {
            let (rt2, signal, opening, done) = (
                rt.clone(),
                signal.clone(),
                std::sync::Arc::clone(&opening),
                std::sync::Arc::clone(&done),
            );
            let fut = async move {
                wait_until(&rt2, &signal, |now| {
                    let at = opening.lock().map(|g| *g).unwrap_or(Instant::ZERO);
                    (now < at).then_some(at)
                })
                .await;
                done.store(true, Ordering::SeqCst);
            };
            is_send(&fut);
            rt.spawn(fut);
        }
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(100)));
        // A lower pressure signal: the bucket now opens at 10 ms (GateAction::Wake).
        if let Ok(mut g) = opening.lock() {
            *g = Instant::from_millis(10);
        }
        signal.notify();
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(
            rt.clock.next_deadline(),
            Some(Instant::from_millis(10)),
            "the timer is re-armed at the earlier opening, the old one dropped"
        );
        assert_eq!(rt.clock.sleepers(), 1);
        rt.clock.advance(Duration::from_millis(9));
        assert_eq!(ex.run_until_stalled(), 1);
        assert!(!done.load(Ordering::SeqCst));
        rt.clock.advance(Duration::from_millis(1));
        assert_eq!(ex.run_until_stalled(), 0);
        assert!(done.load(Ordering::SeqCst), "opens exactly at 10 ms");
        assert_eq!((rt.clock.sleepers(), signal.listeners()), (0, 0));
    }
}
