//! The one drive step of a handle over a timed machine, and its timer loop.
//!
//! A handle whose machine has deadlines (the write gate, the connection table) applies every
//! input the same way: under the lock, run the input, drain the machine's actions, and see
//! whether `poll_timeout` moved earlier; after the lock, carry out the actions and, if it did,
//! notify the timer signal so the handle's timer loop re-arms. [`drive`] is that step and
//! [`drive_timeouts`] that loop; a handle says only what its actions mean.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use super::events::{EventTap, Observed, lock_observed};
use super::loom::{Mutex, lock};
use super::{Runtime, WakeSignal, wait_until};
use crate::time::Instant;

/// The poller half of a sans-IO machine, as the drive step sees it (the machine's own
/// `poll_timeout` and `poll_action`, or those of the machine inside a handle's state).
pub(crate) trait Timed {
    /// What the machine asks its driver to do.
    type Action;

    /// When the machine next wants `handle_timeout`.
    fn poll_timeout(&self) -> Option<Instant>;

    /// The next action to carry out, if any.
    fn poll_action(&mut self) -> Option<Self::Action>;
}

/// Runs `input` on the locked `state`, hands each action the machine then emits to
/// `on_action` (still under the lock: it may only collect, e.g. set a flag or take out what is
/// to be dropped after unlock), and, once the lock is dropped, hands the machine's events to
/// `tap`'s sink and notifies `timer` if the input moved the machine's `poll_timeout` earlier.
/// Do not block in `input` or `on_action`.
///
/// `input` may run user code (a key's `Hash`, the closure of `GateHandle::update`). If it
/// panics, whatever it did to the machine before the panic is still followed through: the
/// actions it made the machine emit are drained and the timer is notified, and only then
/// does the panic resume, out of `drive`, to the caller that supplied `input`. Otherwise a
/// `Wake` emitted before the panic would wait for the next input, and a deadline moved earlier
/// would never re-arm the timer (the next input compares against the moved one).
pub(crate) fn drive<M: Timed + Observed, T>(
    state: &Mutex<M>,
    tap: &EventTap<M::Event>,
    timer: &WakeSignal,
    input: impl FnOnce(&mut M) -> T,
    mut on_action: impl FnMut(&mut M, M::Action),
) -> T {
    let (out, earlier) = {
        let mut st = lock_observed(state, tap);
        let before = st.poll_timeout();
        let out = catch_unwind(AssertUnwindSafe(|| input(&mut st)));
        while let Some(action) = st.poll_action() {
            on_action(&mut st, action);
        }
        let earlier = match (before, st.poll_timeout()) {
            (Some(b), Some(a)) => a < b,
            (None, Some(_)) => true,
            _ => false,
        };
        (out, earlier)
    };
    if earlier {
        timer.notify();
    }
    out.unwrap_or_else(|payload| resume_unwind(payload))
}

/// A timer loop, forever: sleeps until the machine's `poll_timeout` on `rt`'s clock, then
/// calls `fire` (which applies the timeout through [`drive`]). With nothing scheduled it sleeps
/// until `timer` is notified; an input that moves `poll_timeout` earlier re-arms it.
pub(crate) async fn drive_timeouts<R: Runtime, M: Timed>(
    rt: &R,
    state: &Mutex<M>,
    timer: &WakeSignal,
    mut fire: impl FnMut(),
) {
    loop {
        wait_until(rt, timer, |now| match lock(state).poll_timeout() {
            Some(at) if at <= now => None,
            Some(at) => Some(at),
            // Nothing scheduled: sleep until an input notifies the timer signal.
            None => Some(Instant::MAX),
        })
        .await;
        fire();
    }
}
