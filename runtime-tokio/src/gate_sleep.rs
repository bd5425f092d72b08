//! [`GateSleep`]: the timer arm of a sender task's `tokio::select!` loop over a
//! [`WriteGate`](throttle_sansio::write_gate::WriteGate) it owns.

use core::pin::Pin;

use throttle_sansio::Instant;
use throttle_sansio::time::StdEpoch;
use throttle_sansio::write_gate::{GateTimer, TimerChange};
use tokio::time::Sleep;

/// One `tokio::time::Sleep` kept equal to a gate's [`poll_timeout`], for a single task that
/// owns its [`WriteGate`] (no lock, no [`GateHandle`](crate::GateHandle)).
///
/// The decisions are the core's [`GateTimer`]; this type only carries them out on tokio's
/// clock, mapping core instants through a [`StdEpoch`] (with paused time the epoch and the
/// clock are tokio's virtual ones, so tests run instantly). The loop:
///
/// 1. after every input to the gate, [`update`](Self::update) with `gate.poll_timeout()`:
///    the sleep is reset only when the deadline appeared or moved (earlier or later);
/// 2. in `select!`, the arm `at = sleep.fired() => { gate.handle_timeout(sleep.now()); … }`.
///
/// [`fired`](Self::fired) is cancel-safe: when another arm wins, dropping its future loses
/// nothing (the sleep lives in `self`, and the next call waits for the same deadline). It
/// never completes while disarmed, and completes once per arming: after it returns, the
/// timer is disarmed until the next `update`. Since `handle_timeout(now)` evicts every gate
/// due by `now`, the next `poll_timeout` is later, so the loop does not spin.
///
/// ```
/// use std::collections::hash_map::RandomState;
/// use throttle_tokio::write_gate::{WriteGate, WriteGateConfig};
/// use throttle_tokio::{GateSleep, Signal};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut gate: WriteGate<u32, RandomState> = WriteGate::new(WriteGateConfig::default()).unwrap();
/// let mut sleep = GateSleep::starting_now();
/// gate.handle_kv_signal(sleep.now(), &7, Signal::Pressure(500_000)); // 750 ms
/// sleep.update(gate.poll_timeout());
/// let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(1);
/// drop(tx);
/// loop {
///     tokio::select! {
///         at = sleep.fired() => {
///             gate.handle_timeout(sleep.now());
///             assert_eq!(at, throttle_tokio::Instant::from_millis(750));
///             break;
///         }
///         Some(_) = rx.recv() => {}
///     }
///     sleep.update(gate.poll_timeout());
/// }
/// assert!(gate.is_empty());
/// # }
/// ```
///
/// [`poll_timeout`]: throttle_sansio::write_gate::WriteGate::poll_timeout
/// [`WriteGate`]: throttle_sansio::write_gate::WriteGate
#[derive(Debug)]
pub struct GateSleep {
    sleep: Pin<Box<Sleep>>,
    timer: GateTimer,
    /// The tokio deadline the sleep is reset to, `None` when disarmed or when the armed core
    /// instant is past what `std::time::Instant` can represent (never fires).
    deadline: Option<tokio::time::Instant>,
    epoch: StdEpoch,
}

impl GateSleep {
    /// A disarmed timer on `epoch`'s timeline: every instant the gate sees must be
    /// [`Instant::from_std`] on the same epoch (see [`now`](Self::now)).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with the time driver enabled (as `tokio::time::sleep` does).
    pub fn new(epoch: StdEpoch) -> Self {
        GateSleep {
            sleep: Box::pin(tokio::time::sleep_until(tokio::time::Instant::now())),
            timer: GateTimer::new(),
            deadline: None,
            epoch,
        }
    }

    /// [`new`](Self::new) on an epoch at tokio's current instant (virtual under paused time):
    /// the core timeline starts at [`Instant::ZERO`] now.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with the time driver enabled.
    pub fn starting_now() -> Self {
        Self::new(StdEpoch::at(tokio::time::Instant::now().into_std()))
    }

    /// The epoch core instants are mapped through.
    pub fn epoch(&self) -> StdEpoch {
        self.epoch
    }

    /// Tokio's current instant on this timer's timeline: the `now` to give the gate.
    pub fn now(&self) -> Instant {
        Instant::from_std(self.epoch, tokio::time::Instant::now().into_std())
    }

    /// The core instant the timer is armed for, if armed.
    pub fn armed(&self) -> Option<Instant> {
        self.timer.armed()
    }

    /// Make the timer fire at `wanted` (the gate's `poll_timeout()`): resets the sleep only
    /// when [`GateTimer::update`] says the deadline appeared or moved; returns that answer.
    pub fn update(&mut self, wanted: Option<Instant>) -> TimerChange {
        let change = self.timer.update(wanted);
        match change {
            TimerChange::Arm(at) => {
                self.deadline = at.to_std(self.epoch).map(tokio::time::Instant::from_std);
                if let Some(deadline) = self.deadline {
                    self.sleep.as_mut().reset(deadline);
                }
            }
            TimerChange::Disarm => self.deadline = None,
            // `TimerChange` is non-exhaustive: anything else leaves the sleep alone.
            _ => {}
        }
        change
    }

    /// Completes at the armed deadline with the core instant it was armed for, and disarms;
    /// pending forever while disarmed. Cancel-safe (see the type's docs).
    pub async fn fired(&mut self) -> Instant {
        let (Some(at), Some(_)) = (self.timer.armed(), self.deadline) else {
            return core::future::pending().await;
        };
        self.sleep.as_mut().await;
        // The sleep is reset on every arming and `self` is borrowed until here, so this
        // completion is the current arming's.
        let current = self.timer.fire(at);
        debug_assert!(current, "the sleep fired for an arming that is not current");
        self.deadline = None;
        at
    }
}
