//! [`GateHandle`]: the write gate shared by a writer's tasks, with `wait_until_open` that
//! wakes early when an input moves a bucket's opening earlier.
//!
//! Inputs go through [`GateHandle::update`] (or the named helpers), which runs them on the
//! gate under the lock and drains the gate's actions; a [`GateAction::Wake`] becomes a
//! [`WakeSignal::notify`] after the lock is dropped. Sleepers in
//! [`wait_until_open`](GateHandle::wait_until_open) read the signal's epoch before the gate
//! (see [`wait_until`]), so they re-arm their timer at the new opening and never sleep on a
//! stale one.

use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use super::drive::{Timed, drive, drive_timeouts};
use super::loom::{Arc, Mutex, lock};
use super::{Runtime, WakeSignal, wait_until};
use crate::backpressure::Signal;
use crate::error::ConfigError;
use crate::rng::Rng;
use crate::time::Instant;
use crate::write_gate::{GateAction, GateState, WriteGate, WriteGateConfig};

/// A cloneable handle to a [`WriteGate`] shared by a writer's tasks. `Clone + Send + Sync`
/// (for `Send` bucket keys and hasher); clones share one gate and one wake signal.
///
/// # Contract
///
/// - Inputs: the `handle_*` helpers, or [`update`](Self::update) for any other gate input.
///   Each runs under the lock, then every `GateAction::Wake` the gate emitted notifies
///   [`signal`](Self::signal) after the lock is dropped.
/// - Waiting: [`wait_until_open`](Self::wait_until_open) resolves with the bucket's first state
///   that is not a timed closure: `Open`, `Probing` (wait for a success) or `UnknownLeader`
///   (refresh metadata, then wait again). It sleeps until the opening on the runtime's clock
///   and re-arms whenever a Wake moves an opening earlier.
/// - Eviction: [`drive_timeouts`](Self::drive_timeouts) is the gate's timer loop
///   (`poll_timeout` → sleep → `handle_timeout`); spawn it once per gate. Reads treat expired
///   gates as open without it; it only frees memory.
/// - Queries: [`check`](Self::check), [`remaining`](Self::remaining).
///
/// The hasher `S` defaults to std's [`RandomState`](std::hash::RandomState), which
/// [`new`](GateHandle::new) uses; [`with_hasher`](Self::with_hasher) takes any other.
///
/// ```
/// use throttle_sansio::{GateState, Instant, Signal, WriteGateConfig};
/// use throttle_sansio::sync::GateHandle;
///
/// // No annotation: `new` builds a `GateHandle<u32, RandomState>`.
/// let gate = GateHandle::new(WriteGateConfig::default()).expect("the default config is valid");
/// let wait = gate.handle_kv_signal(Instant::ZERO, &7u32, Signal::Full);
/// assert!(matches!(gate.check(Instant::ZERO, &7), GateState::Closed { .. }));
/// assert_eq!(gate.check(Instant::ZERO + wait, &7), GateState::Open);
/// ```
pub struct GateHandle<K, S = std::hash::RandomState> {
    shared: Arc<Mutex<WriteGate<K, S>>>,
    /// Notified on every `GateAction::Wake`: sleepers re-check their bucket.
    signal: WakeSignal,
    /// Notified when an input moves `poll_timeout` earlier: the timeout driver re-arms.
    timer: WakeSignal,
}

impl<K, S> Clone for GateHandle<K, S> {
    fn clone(&self) -> Self {
        GateHandle {
            shared: Arc::clone(&self.shared),
            signal: self.signal.clone(),
            timer: self.timer.clone(),
        }
    }
}

impl<K, S> fmt::Debug for GateHandle<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateHandle").finish_non_exhaustive()
    }
}

/// The handle's inputs: each is the gate's input of the same name, run through
/// [`GateHandle::update`] (one lock, then the `Wake` actions turned into a notify).
macro_rules! through_update {
    ($($(#[$doc:meta])* fn $name:ident [$($gen:tt)*] ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {$(
        $(#[$doc])*
        pub fn $name<$($gen)*>(&self, $($arg: $ty),*) $(-> $ret)? {
            self.update(|g| g.$name($($arg),*))
        }
    )*};
}

impl<K: Hash + Eq + Clone> GateHandle<K, std::hash::RandomState> {
    /// A handle over a new gate, hashing bucket keys with a fresh std
    /// [`RandomState`](std::hash::RandomState) (as `HashMap::new` does); refuses an invalid
    /// `cfg`. For another hasher, [`with_hasher`](Self::with_hasher).
    pub fn new(cfg: WriteGateConfig) -> Result<Self, ConfigError> {
        WriteGate::new(cfg).map(Self::from_gate)
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> GateHandle<K, S> {
    /// A handle over a new gate, hashing bucket keys with `hasher`; refuses an invalid `cfg`.
    pub fn with_hasher(cfg: WriteGateConfig, hasher: S) -> Result<Self, ConfigError> {
        WriteGate::with_hasher(cfg, hasher).map(Self::from_gate)
    }

    /// A handle over an existing gate.
    pub fn from_gate(gate: WriteGate<K, S>) -> Self {
        GateHandle {
            shared: Arc::new(Mutex::new(gate)),
            signal: WakeSignal::new(),
            timer: WakeSignal::new(),
        }
    }

    /// The signal notified on every `GateAction::Wake`.
    pub fn signal(&self) -> &WakeSignal {
        &self.signal
    }

    /// Runs `input` on the gate under the lock, then turns the gate's `Wake` actions into a
    /// notify of [`signal`](Self::signal) (after the lock is dropped). Do not block in `input`.
    ///
    /// If `input` panics, the panic propagates to this caller, after what `input` did to the
    /// gate before the panic is followed through: the `Wake`s it made the gate emit notify the
    /// signal, and a deadline it moved earlier re-arms
    /// [`drive_timeouts`](Self::drive_timeouts). What it did stays done (the handle rolls
    /// nothing back), and the handle serves every later call.
    pub fn update<T>(&self, input: impl FnOnce(&mut WriteGate<K, S>) -> T) -> T {
        let mut wake = NotifyOnDrop {
            signal: &self.signal,
            due: false,
        };
        drive(&self.shared, &self.timer, input, |_, action| match action {
            GateAction::Wake { .. } => wake.due = true,
        })
        // `wake` notifies here, after `drive` dropped the lock, or while a panic in `input`
        // unwinds out of `drive`.
    }

    through_update! {
        /// [`WriteGate::handle_disk_write_locked`] through [`update`](Self::update).
        fn handle_disk_write_locked[R: Rng + ?Sized](
            now: Instant, bucket: &K, attempts: u32, rng: &mut R
        ) -> Duration;
        /// [`WriteGate::handle_retriable_write`] through [`update`](Self::update).
        fn handle_retriable_write[R: Rng + ?Sized](
            now: Instant, bucket: &K, attempts: u32, rng: &mut R
        ) -> Duration;
        /// [`WriteGate::handle_kv_signal`] through [`update`](Self::update).
        fn handle_kv_signal[](now: Instant, bucket: &K, signal: Signal) -> Duration;
        /// [`WriteGate::handle_leader`] through [`update`](Self::update).
        fn handle_leader[](now: Instant, bucket: &K, known: bool);
        /// [`WriteGate::handle_success`] through [`update`](Self::update).
        fn handle_success[](now: Instant, bucket: &K);
    }

    /// [`WriteGate::check`].
    pub fn check(&self, now: Instant, bucket: &K) -> GateState {
        lock(&self.shared).check(now, bucket)
    }

    /// [`WriteGate::remaining`].
    pub fn remaining(&self, now: Instant, bucket: &K) -> Duration {
        lock(&self.shared).remaining(now, bucket)
    }

    /// Waits while `bucket` is closed with a deadline; resolves with the first other state
    /// (`Open`, `Probing` or `UnknownLeader`). Wakes early, and re-arms its timer, when an
    /// input moves the bucket's opening earlier. Cancel-safe.
    pub async fn wait_until_open<R: Runtime>(&self, rt: &R, bucket: &K) -> GateState {
        let mut state = GateState::Open;
        wait_until(rt, &self.signal, |now| {
            state = lock(&self.shared).check(now, bucket);
            match state {
                GateState::Closed { until, .. } => Some(until),
                _ => None,
            }
        })
        .await;
        state
    }

    /// The gate's timer loop: sleeps until `poll_timeout`, calls `handle_timeout`, forever.
    /// An input that moves `poll_timeout` earlier re-arms it. Spawn it once per gate (drop the
    /// task to stop it); without it, reads still treat expired gates as open, and memory is
    /// freed at the next input's own eviction.
    pub async fn drive_timeouts<R: Runtime>(&self, rt: &R) {
        drive_timeouts(rt, &self.shared, &self.timer, || {
            let now = rt.now();
            self.update(|g| g.handle_timeout(now));
        })
        .await;
    }
}

/// Notifies `signal` when dropped, if `due`: on return and on unwind alike.
struct NotifyOnDrop<'a> {
    signal: &'a WakeSignal,
    due: bool,
}

impl Drop for NotifyOnDrop<'_> {
    fn drop(&mut self) {
        // Never unwinds: the signal's lock is its own, and `wake_all` catches a waker's panic.
        self.signal.notify_if(self.due);
    }
}

impl<K, S> Timed for WriteGate<K, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    type Action = GateAction;

    fn poll_timeout(&self) -> Option<Instant> {
        WriteGate::poll_timeout(self)
    }

    fn poll_action(&mut self) -> Option<GateAction> {
        WriteGate::poll_action(self)
    }
}

#[cfg(all(test, not(loom)))]
mod panics;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::{Executor, TestRuntime};
    use crate::test_hasher::TestHasher;
    use std::sync::Mutex as StdMutex;

    type Gate = GateHandle<u32, TestHasher>;

    fn is_send<T: Send>(_: &T) {}

    #[test]
    fn lower_pressure_wakes_the_sleeper_early_and_it_opens_at_the_new_deadline() {
        let mut ex = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(ex.spawner());
        let gate = Gate::with_hasher(WriteGateConfig::fluss_issue_3454(), TestHasher::default())
            .expect("the default config is valid");
        let t0 = Instant::ZERO;
        // Full pressure: the default curve's ceiling, 5000 ms.
        assert_eq!(
            gate.handle_kv_signal(t0, &7, Signal::Full),
            Duration::from_millis(5000)
        );
        let result = std::sync::Arc::new(StdMutex::new(None));
        {
            let (gate, rt2, result) = (gate.clone(), rt.clone(), std::sync::Arc::clone(&result));
            let fut = async move {
                let state = gate.wait_until_open(&rt2, &7).await;
                if let Ok(mut r) = result.lock() {
                    *r = Some((state, rt2.now()));
                }
            };
            is_send(&fut);
            rt.spawn(fut);
        }
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(5000)));
        // Half pressure: 5000 ms x 0.5^3 = 625 ms; latest-wins shortens it and emits a Wake.
        let epoch = gate.signal().epoch();
        gate.handle_kv_signal(t0, &7, Signal::Pressure(500_000));
        assert!(
            gate.signal().has_changed(epoch),
            "the Wake notified the signal"
        );
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(
            rt.clock.next_deadline(),
            Some(Instant::from_millis(625)),
            "re-armed at the earlier opening"
        );
        rt.clock.advance_to(Instant::from_millis(624));
        assert_eq!(ex.run_until_stalled(), 1);
        rt.clock.advance_to(Instant::from_millis(625));
        assert_eq!(ex.run_until_stalled(), 0);
        let got = result.lock().ok().and_then(|r| *r);
        assert_eq!(got, Some((GateState::Open, Instant::from_millis(625))));
    }

    #[test]
    fn a_longer_install_does_not_wake_sleepers() {
        let gate = Gate::with_hasher(WriteGateConfig::default(), TestHasher::default())
            .expect("the default config is valid");
        let epoch = gate.signal().epoch();
        gate.handle_kv_signal(Instant::ZERO, &1, Signal::Pressure(500_000));
        gate.handle_kv_signal(Instant::ZERO, &1, Signal::Full);
        assert!(
            !gate.signal().has_changed(epoch),
            "longer throttles never wake"
        );
    }

    #[test]
    fn unknown_leader_ends_the_wait_so_the_caller_refreshes() {
        let mut ex = Executor::default();
        let rt = TestRuntime::new();
        let gate = Gate::with_hasher(WriteGateConfig::default(), TestHasher::default())
            .expect("the default config is valid");
        gate.handle_kv_signal(Instant::ZERO, &3, Signal::Full);
        let result = std::sync::Arc::new(StdMutex::new(None));
        {
            let (gate, rt2, result) = (gate.clone(), rt.clone(), std::sync::Arc::clone(&result));
            ex.spawn(async move {
                let state = gate.wait_until_open(&rt2, &3).await;
                if let Ok(mut r) = result.lock() {
                    *r = Some(state);
                }
            });
        }
        assert_eq!(ex.run_until_stalled(), 1);
        gate.handle_leader(Instant::ZERO, &3, false); // drops the KV throttle: a Wake
        assert_eq!(ex.run_until_stalled(), 0);
        assert_eq!(
            result.lock().ok().and_then(|r| *r),
            Some(GateState::UnknownLeader)
        );
    }

    #[test]
    fn timeout_driver_evicts_expired_gates_and_rearms_for_earlier_ones() {
        let mut ex = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(ex.spawner());
        let gate = Gate::with_hasher(WriteGateConfig::fluss_issue_3454(), TestHasher::default())
            .expect("the default config is valid");
        {
            let (gate, rt2) = (gate.clone(), rt.clone());
            rt.spawn(async move { gate.drive_timeouts(&rt2).await });
        }
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(
            rt.clock.next_deadline(),
            Some(Instant::MAX),
            "idle: asleep until an input gates something"
        );
        gate.handle_kv_signal(Instant::ZERO, &1, Signal::Full);
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(5000)));
        gate.handle_kv_signal(Instant::ZERO, &2, Signal::Pressure(500_000));
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(625)));
        rt.clock.advance_to(Instant::from_millis(5000));
        assert_eq!(ex.run_until_stalled(), 1);
        assert!(gate.update(|g| g.is_empty()), "every expired gate evicted");
    }
}

/// The gate's race, in the style of `sync::loom_models` (run with the same command).
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::test_support::{CountingWaker, TestRuntime, repoll_while_woken};
    use crate::test_hasher::TestHasher;
    use alloc::boxed::Box;
    use core::task::{Context, Poll};
    use loom::thread;

    /// The gate's wake signal races a sleeper in `GateHandle::wait_until_open` that is reading the
    /// gate and arming its timer: a lower KV pressure (latest-wins, a `Wake`) on another thread
    /// must leave the sleeper asleep with its only timer at the new, earlier opening.
    #[test]
    fn gate_wake_racing_a_sleeper_rearms_its_timer_at_the_earlier_opening() {
        loom::model(|| {
            let rt = TestRuntime::new();
            let gate: GateHandle<u32, TestHasher> =
                GateHandle::with_hasher(WriteGateConfig::fluss_issue_3454(), TestHasher::default())
                    .expect("the default config is valid");
            let _ = gate.handle_kv_signal(Instant::ZERO, &7, Signal::Full); // 5000 ms

            let gate2 = gate.clone();
            let t1 = thread::spawn(move || {
                // 5000 ms x 0.5^3 = 625 ms: latest-wins shortens it and emits a Wake.
                let _ = gate2.handle_kv_signal(Instant::ZERO, &7, Signal::Pressure(500_000));
            });

            let (waker, wakes) = CountingWaker::new();
            let mut cx = Context::from_waker(&waker);
            let mut sleeper = Box::pin(gate.wait_until_open(&rt, &7));
            assert!(sleeper.as_mut().poll(&mut cx).is_pending());
            let _ = t1.join();
            repoll_while_woken(sleeper.as_mut(), &wakes, &mut cx);
            assert_eq!(
                rt.clock.next_deadline(),
                Some(Instant::from_millis(625)),
                "asleep on the old opening: the Wake was lost"
            );
            assert_eq!(rt.clock.sleepers(), 1, "the old timer was dropped");
            rt.clock.advance_to(Instant::from_millis(625));
            assert_eq!(sleeper.as_mut().poll(&mut cx), Poll::Ready(GateState::Open));
        });
    }
}
