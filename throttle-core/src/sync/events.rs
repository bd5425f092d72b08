//! Event sinks: where a handle sends the observation events its machine records.
//!
//! A handle with a sink ([`GateHandle::set_event_sink`](super::GateHandle::set_event_sink) and
//! its siblings) turns its machine's events on. Every critical section that changes the
//! machine ends the same way: drain the machine's events under the lock, drop the lock, then
//! hand each event to the sink. The sink is user code, so it runs outside the lock and under
//! `catch_unwind`: a sink that panics loses that one event (counted in
//! [`sink_panics`](EventTap::panics)), and the input that caused it returns normally.
//!
//! With no sink, the machine's events stay off, and a critical section only checks that its
//! machine's event queue is empty before it unlocks.
//!
//! Where a critical section wakes someone after it unlocks (a waiter handed a credit, the
//! timer loop re-armed, the callers of a finished refresh, a batch handed to the transport),
//! the sink runs before those wakes. So a task woken by a section acts only after the sink saw
//! that section's events. That is not a causal order: a task that finds the change without
//! being woken (a future re-polled on its own, an acquire's timeout firing, a dropped
//! future releasing a credit handed to it) may deliver its own events first, so a waiter's
//! `Released` can reach the sink before the `Dispatched` of the credit it got. Events of
//! sections on different threads may reach the sink in either order. The cost: a slow sink
//! delays those wakes, so a sink should only record, or hand the event to a channel.
//!
//! Setting and clearing a sink ([`EventTap::install`]) both run under the machine's lock (a
//! striped window's every stripe lock, in stripe order), with the slot's lock taken inside it
//! (the one lock order here: state, then slot), so
//! whichever of two racing calls comes last wins both halves: the machine's events are on
//! exactly while a sink is set (unless user code changes the machine's event capacity
//! itself, as `GateHandle::update` could). An event recorded before a `clear` and delivered
//! after it finds no sink; it is counted ([`EventTap::unseen`]) in the handle's
//! `events_dropped`. A delivery already running when `clear` is called still calls the old
//! sink (it holds its own reference), on its own thread, after `clear` returned.

use alloc::vec::Vec;
use core::ops::{Deref, DerefMut};

use smallvec::SmallVec;

use std::sync::Arc;

use super::loom::{Mutex, MutexGuard, lock};
use super::unwind;

/// Receives a handle's observation events ([`crate::event`]): one call per event, in the order
/// the machine recorded them, after the handle's lock is released, on the thread whose input
/// (or timer) caused it.
///
/// Any `Fn(&E) + Send + Sync` closure is a sink. With the `tracing` feature,
/// `sync::trace::Tracing` is one for every event type.
///
/// A sink must not block for long: the input that caused the event waits for it, and so do
/// the wakes that input causes (the sink runs before them). It may call back into the handle (no lock is held). A panic in it is
/// caught: the event is lost and counted, and nothing else changes.
pub trait EventSink<E>: Send + Sync {
    /// One event.
    fn on_event(&self, event: &E);
}

impl<E, F: Fn(&E) + Send + Sync> EventSink<E> for F {
    fn on_event(&self, event: &E) {
        self(event);
    }
}

/// How many undrained events a handle's machine keeps. The handle drains them after every
/// input, so only one input's events are ever queued; an input that records more (a timer pass
/// releasing thousands at once) loses the oldest, counted in the machine's `events_dropped`.
pub(crate) const EVENT_CAPACITY: usize = 4096;

/// A handle's sink slot, shared by its clones, and the panics its sink has raised.
pub(crate) struct EventTap<E> {
    slot: Mutex<Slot<E>>,
}

struct Slot<E> {
    sink: Option<Arc<dyn EventSink<E>>>,
    panics: u64,
    /// Events that reached `deliver` with no sink set (a `clear` came between their
    /// recording and their delivery).
    unseen: u64,
}

impl<E> Default for EventTap<E> {
    fn default() -> Self {
        EventTap {
            slot: Mutex::new(Slot {
                sink: None,
                panics: 0,
                unseen: 0,
            }),
        }
    }
}

impl<E> EventTap<E> {
    /// Installs (or, with `None`, removes) the sink, and calls `turn(state, capacity)` to set
    /// the machine's event capacity to match ([`EVENT_CAPACITY`] with a sink, 0 without),
    /// on every one of `states` (one, or a striped handle's stripes), all under the states'
    /// locks (taken in slice order, then the slot's): two racing installs cannot leave the
    /// events on with no sink, or off with one, on any state. `turn` must run no user code.
    pub(crate) fn install<'s, T: 's>(
        &self,
        states: impl IntoIterator<Item = &'s Mutex<T>>,
        sink: Option<Arc<dyn EventSink<E>>>,
        mut turn: impl FnMut(&mut T, usize),
    ) {
        // Every state's lock, in order (a striped handle's stripes), then the slot's.
        let mut all: Vec<_> = states.into_iter().map(lock).collect();
        let capacity = if sink.is_some() { EVENT_CAPACITY } else { 0 };
        let old = core::mem::replace(&mut lock(&self.slot).sink, sink);
        for st in &mut all {
            turn(st, capacity);
        }
        drop(all);
        // The old sink's own drop (user code) runs with no lock held.
        drop(old);
    }

    /// Events the sink panicked on so far.
    pub(crate) fn panics(&self) -> u64 {
        lock(&self.slot).panics
    }

    /// Events that found no sink when delivered: recorded before a `clear_event_sink`,
    /// delivered after it.
    pub(crate) fn unseen(&self) -> u64 {
        lock(&self.slot).unseen
    }

    /// Hands `events` to the sink, each under `catch_unwind`. Call with no lock held. Returns
    /// whether a sink was set (without one the events are counted as [`unseen`](Self::unseen)).
    pub(crate) fn deliver(&self, events: Drained<E>) -> bool {
        if events.is_empty() {
            return true;
        }
        let sink = {
            let mut slot = lock(&self.slot);
            match slot.sink.clone() {
                Some(sink) => sink,
                None => {
                    let n = u64::try_from(events.len()).unwrap_or(u64::MAX);
                    slot.unseen = slot.unseen.saturating_add(n);
                    return false;
                }
            }
        };
        let mut panics = 0u64;
        for event in &events {
            if unwind::call(|| sink.on_event(event)).is_err() {
                panics = panics.saturating_add(1);
            }
        }
        if panics > 0 {
            let mut slot = lock(&self.slot);
            slot.panics = slot.panics.saturating_add(panics);
        }
        true
    }
}

/// The events of one critical section: inline up to four (one input records one or two), so
/// a handle with a sink allocates nothing per input in the common case.
pub(crate) type Drained<E> = SmallVec<[E; 4]>;

/// The state behind a handle's lock, as the tap sees it: where its machine's events come out.
pub(crate) trait Observed {
    /// The machine's event type.
    type Event;

    /// The oldest undrained event (always `None` while the machine's events are off).
    fn poll_event(&mut self) -> Option<Self::Event>;

    /// Whether an event may be waiting: `false` only if none is. The guard's fast path, so it
    /// must be one load and a compare (the machine's queue length).
    fn has_events(&self) -> bool;
}

/// Drains `state`'s events into a list.
pub(crate) fn drain<T: Observed + ?Sized>(state: &mut T) -> Drained<T::Event> {
    let mut events = Drained::new();
    while let Some(event) = state.poll_event() {
        events.push(event);
    }
    events
}

/// A lock guard that, when dropped, drains the state's events, unlocks, and only then hands
/// the events to the tap's sink: every critical section that changes an observed machine takes
/// its lock through [`lock_observed`], so no path can forget the events, and none calls the
/// sink under the lock. Dropped while a panic unwinds, it still delivers (the sink's own panic
/// is caught).
pub(crate) struct ObservedGuard<'a, T: Observed> {
    guard: Option<MutexGuard<'a, T>>,
    tap: &'a EventTap<T::Event>,
}

/// Locks `state` (recovering a poisoned lock, as [`lock`]) for a critical section whose
/// events go to `tap` once it ends.
pub(crate) fn lock_observed<'a, T: Observed>(
    state: &'a Mutex<T>,
    tap: &'a EventTap<T::Event>,
) -> ObservedGuard<'a, T> {
    ObservedGuard {
        guard: Some(lock(state)),
        tap,
    }
}

impl<T: Observed> Deref for ObservedGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // The guard is taken only in `drop`.
        self.guard.as_deref().unwrap_or_else(|| unreachable!())
    }
}

impl<T: Observed> DerefMut for ObservedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_deref_mut().unwrap_or_else(|| unreachable!())
    }
}

impl<T: Observed> Drop for ObservedGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Events off (or none recorded): unlock, and nothing else.
        if self.guard.as_deref().is_some_and(Observed::has_events) {
            self.deliver();
        }
    }
}

impl<T: Observed> ObservedGuard<'_, T> {
    /// Drains the events, unlocks, and hands them to the sink.
    #[cold]
    #[inline(never)]
    fn deliver(&mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        let events = drain(&mut *guard);
        drop(guard);
        self.tap.deliver(events);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::sync::test_support::{CountingWaker, poll_once};
    use crate::sync::{GateHandle, WindowHandle};
    use crate::test_hasher::TestHasher;
    use crate::time::Instant;
    use crate::{GateEvent, Reason, Signal, WindowConfig, WindowEvent, WriteGateConfig};
    use alloc::boxed::Box;
    use alloc::vec::Vec;
    use std::sync::Mutex as StdMutex;

    /// A sink that records what it sees, after reading the handle through `probe` (which
    /// would deadlock if the sink ran under the handle's lock).
    fn recorder<E: Clone + Send + 'static>(
        probe: impl Fn() + Send + Sync + 'static,
    ) -> (
        std::sync::Arc<StdMutex<Vec<E>>>,
        impl Fn(&E) + Send + Sync + 'static,
    ) {
        let seen = std::sync::Arc::new(StdMutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        (seen, move |e: &E| {
            probe();
            log.lock().unwrap().push(e.clone());
        })
    }

    #[test]
    fn a_gate_sink_sees_installs_and_wakes_in_order_outside_the_lock() {
        let gate: GateHandle<u32, TestHasher> =
            GateHandle::with_hasher(WriteGateConfig::default(), TestHasher::default()).unwrap();
        // Off until a sink is set: nothing is recorded or dropped.
        let _ = gate.handle_kv_signal(Instant::ZERO, &1, Signal::Full);
        let probe = gate.clone();
        let (seen, sink) = recorder(move || {
            let _ = probe.check(Instant::ZERO, &1);
        });
        gate.set_event_sink(sink);
        assert!(
            seen.lock().unwrap().is_empty(),
            "nothing recorded while off"
        );
        let t = Instant::from_millis(10);
        let wait = gate.handle_kv_signal(t, &7, Signal::Full);
        // The signal clears: the bucket opens at once, earlier than it was (a Wake).
        let _ = gate.handle_kv_signal(t, &7, Signal::Clear);
        let got = seen.lock().unwrap().clone();
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(
            matches!(
                got[0],
                GateEvent::Installed { bucket: 7, reason: Reason::KV_BACKPRESSURE, delay, .. }
                    if delay == wait
            ),
            "{got:?}"
        );
        assert!(
            matches!(
                got[1],
                GateEvent::Installed {
                    bucket: 7,
                    reason_opens_at: None,
                    ..
                }
            ),
            "{got:?}"
        );
        assert!(matches!(got[2], GateEvent::Wake { .. }), "{got:?}");
        assert_eq!((gate.events_dropped(), gate.event_sink_panics()), (0, 0));

        // Cleared: the gate records nothing more.
        gate.clear_event_sink();
        let _ = gate.handle_kv_signal(t, &8, Signal::Full);
        assert_eq!(seen.lock().unwrap().len(), 3);
    }

    #[test]
    fn a_handle_over_a_gate_with_events_on_turns_them_off_until_a_sink_is_set() {
        let mut g: crate::WriteGate<u32, TestHasher> =
            crate::WriteGate::with_hasher(WriteGateConfig::default(), TestHasher::default())
                .unwrap();
        g.set_event_capacity(8);
        let _ = g.handle_kv_signal(Instant::ZERO, &1, Signal::Full);
        let gate = GateHandle::from_gate(g);
        let _ = gate.handle_kv_signal(Instant::ZERO, &2, Signal::Full);
        // Nothing recorded with no sink: none dropped, none lost unseen.
        assert_eq!(gate.events_dropped(), 0);
        let (seen, sink) = recorder(|| {});
        gate.set_event_sink(sink);
        let _ = gate.handle_kv_signal(Instant::ZERO, &3, Signal::Full);
        let got: Vec<GateEvent<u32>> = seen.lock().unwrap().clone();
        assert!(
            matches!(got[..], [GateEvent::Installed { bucket: 3, .. }]),
            "{got:?}"
        );
    }

    #[test]
    fn a_panicking_sink_loses_each_event_and_the_input_returns() {
        let gate: GateHandle<u32, TestHasher> =
            GateHandle::with_hasher(WriteGateConfig::default(), TestHasher::default()).unwrap();
        gate.set_event_sink(|_: &GateEvent<u32>| panic!("user sink"));
        let wait = gate.handle_kv_signal(Instant::ZERO, &7, Signal::Full);
        assert!(wait > core::time::Duration::ZERO);
        let _ = gate.handle_kv_signal(Instant::ZERO, &8, Signal::Full);
        assert_eq!(gate.event_sink_panics(), 2);
        // The gate is unharmed and still serves.
        assert!(matches!(
            gate.check(Instant::ZERO, &7),
            crate::GateState::Closed { .. }
        ));
    }

    #[test]
    fn a_window_sink_sees_issues_releases_and_the_hand_on_to_a_waiter() {
        let window: WindowHandle<u32, TestHasher> = WindowHandle::with_hasher(
            WindowConfig::default().with_max_in_flight(1),
            TestHasher::default(),
        )
        .unwrap();
        let probe = window.clone();
        let (seen, sink) = recorder(move || {
            let _ = probe.available(&5);
        });
        window.set_event_sink(sink);
        let first = window.try_acquire(5).unwrap();
        let (waker, _) = CountingWaker::new();
        let mut second = Box::pin(window.acquire(5));
        assert!(poll_once(&mut second, &waker).is_pending());
        drop(first); // hands the credit on to `second`
        let std::task::Poll::Ready(Ok(permit)) = poll_once(&mut second, &waker) else {
            panic!("the waiter got the credit");
        };
        drop(permit);
        let got = seen.lock().unwrap().clone();
        let shape: Vec<_> = got
            .iter()
            .map(|e| match e {
                WindowEvent::Dispatched { shard, .. } => ("dispatched", *shard),
                WindowEvent::Released { in_flight, .. } => ("released", *in_flight),
            })
            .collect();
        assert_eq!(
            shape,
            // The first release hands its credit on: the shard still has one in flight.
            [
                ("dispatched", 5),
                ("released", 1),
                ("dispatched", 5),
                ("released", 0)
            ],
            "{got:?}"
        );
        assert_eq!(
            (window.events_dropped(), window.event_sink_panics()),
            (0, 0)
        );
    }
}
