//! The timer arm of a single-owner sender loop, sans-IO: which instant the one timer is armed
//! for, and what to do with it after each input.

use crate::time::Instant;

/// What to do with the loop's one timer, as [`GateTimer::update`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimerChange {
    /// The timer is armed for the right instant (or disarmed and should stay so): leave it.
    Keep,
    /// (Re-)arm the timer for this instant (earlier or later than before, or first arming).
    /// It may be in the past: fire at once.
    Arm(Instant),
    /// Nothing is gated: disarm the timer.
    Disarm,
}

/// The armed instant of the one timer a sender task keeps for its [`WriteGate`](super::WriteGate),
/// and the rules that keep it equal to [`poll_timeout`](super::WriteGate::poll_timeout).
///
/// The loop owns one timer (a `tokio::time::Sleep`, a timer wheel entry, a `recv_timeout`
/// deadline) and this value beside it. After every input it passes
/// `gate.poll_timeout()` to [`update`](Self::update) and applies the [`TimerChange`]; when the
/// timer fires at some instant it asks [`fire`](Self::fire) whether that firing is still
/// current (a timer re-armed since, or a stale firing left in a channel, is not), and only
/// then calls `gate.handle_timeout(now)`. Since `handle_timeout` evicts every gate due by
/// `now`, the next `poll_timeout` is later than `now`, so a loop that follows these answers
/// never fires twice for one deadline (it cannot spin).
///
/// ```
/// use throttle_sansio::Instant;
/// use throttle_sansio::write_gate::{GateTimer, TimerChange};
///
/// let mut timer = GateTimer::new();
/// let (t1, t2) = (Instant::from_millis(100), Instant::from_millis(50));
/// assert_eq!(timer.update(Some(t1)), TimerChange::Arm(t1));
/// assert_eq!(timer.update(Some(t1)), TimerChange::Keep); // no change, no re-arm
/// assert_eq!(timer.update(Some(t2)), TimerChange::Arm(t2)); // moved earlier
/// assert!(!timer.fire(t1)); // the old arming fired late: stale, ignore it
/// assert!(timer.fire(t2)); // current: now call gate.handle_timeout
/// assert_eq!(timer.armed(), None); // a fired timer is disarmed
/// assert_eq!(timer.update(None), TimerChange::Keep);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateTimer {
    armed: Option<Instant>,
}

impl GateTimer {
    /// A disarmed timer.
    pub const fn new() -> Self {
        GateTimer { armed: None }
    }

    /// The instant the timer is armed for, if armed.
    pub const fn armed(&self) -> Option<Instant> {
        self.armed
    }

    /// The change that makes the timer fire at `wanted` (the gate's
    /// [`poll_timeout`](super::WriteGate::poll_timeout)): `Keep` when it already does (or is
    /// disarmed and `wanted` is `None`), `Arm(at)` when the deadline appeared or moved
    /// (earlier or later: a later one means the earliest bucket was lifted or forgotten, and
    /// firing early would only wake the loop for nothing), `Disarm` when nothing is gated.
    /// Records the answer as the armed state.
    pub fn update(&mut self, wanted: Option<Instant>) -> TimerChange {
        if wanted == self.armed {
            return TimerChange::Keep;
        }
        self.armed = wanted;
        match wanted {
            Some(at) => TimerChange::Arm(at),
            None => TimerChange::Disarm,
        }
    }

    /// The timer armed for `at` fired: `true` if that is the current arming (the caller then
    /// calls `handle_timeout` and [`update`](Self::update)s again), `false` for a stale
    /// firing (the timer was re-armed or disarmed since), which the caller ignores. A current
    /// firing disarms.
    pub fn fire(&mut self, at: Instant) -> bool {
        if self.armed == Some(at) {
            self.armed = None;
            true
        } else {
            false
        }
    }
}
