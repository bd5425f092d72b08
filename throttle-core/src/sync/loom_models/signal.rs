//! The wake signal, `wait_until` and the drivers' one-shot slot.

use alloc::boxed::Box;
use core::task::{Context, Poll};

use loom::thread;

use super::join;
use crate::sync::loom::{Arc, Mutex, lock};
use crate::sync::test_support::{CountingWaker, TestRuntime, poll_once, repoll_while_woken};
use crate::sync::{Closed, WakeSignal, wait_until};
use crate::time::Instant;

/// The gate's wake signal races a sleeper that is reading the gate and arming its timer: the
/// sleeper ends up with its timer at the new, earlier opening (never asleep on the old one).
#[test]
fn wake_signal_racing_a_sleeper_rearms_its_timer_at_the_earlier_opening() {
    super::model(|| {
        let rt = TestRuntime::new();
        let signal = WakeSignal::new();
        // A stand-in for a gated bucket (the gate's own model is in `gate.rs`).
        let opening = Arc::new(Mutex::new(Instant::from_millis(100)));

        let (signal2, opening2) = (signal.clone(), Arc::clone(&opening));
        let t1 = thread::spawn(move || {
            *lock(&opening2) = Instant::from_millis(10); // a Wake: the opening moved earlier
            signal2.notify();
        });

        let (waker, wakes) = CountingWaker::new();
        let gate = Arc::clone(&opening);
        let mut sleeper = Box::pin(wait_until(&rt, &signal, move |now| {
            let at = *lock(&gate);
            (now < at).then_some(at)
        }));
        let mut cx = Context::from_waker(&waker);
        assert!(sleeper.as_mut().poll(&mut cx).is_pending()); // read the gate, arm, listen
        join(t1);
        // Re-poll for as long as it was woken; after that it is asleep for good.
        repoll_while_woken(sleeper.as_mut(), &wakes, &mut cx);
        assert_eq!(
            rt.clock.next_deadline(),
            Some(Instant::from_millis(10)),
            "asleep on the old opening: the signal was lost"
        );
        assert_eq!(rt.clock.sleepers(), 1, "the old timer was dropped");
        rt.clock.advance_to(Instant::from_millis(10));
        assert!(sleeper.as_mut().poll(&mut cx).is_ready());
    });
}

/// A one-shot send (a batch result, a refresh release) racing the receiver's first poll: the
/// receiver either sees the value at once or is woken for it; a sender dropped instead
/// resolves it to `Closed` the same way.
#[test]
fn oneshot_send_or_drop_racing_the_first_poll_loses_no_wakeup() {
    for send in [true, false] {
        super::model(move || {
            let (tx, mut rx) = crate::sync::oneshot::channel::<u32>();
            let t = thread::spawn(move || {
                if send {
                    tx.send(7);
                } else {
                    drop(tx);
                }
            });
            let (waker, count) = CountingWaker::new();
            let first = poll_once(&mut rx, &waker);
            join(t);
            let expected = if send { Ok(7) } else { Err(Closed) };
            match first {
                Poll::Ready(got) => assert_eq!(got, expected),
                Poll::Pending => {
                    assert_eq!(count.wakes(), 1, "lost wake-up");
                    assert_eq!(poll_once(&mut rx, &waker), Poll::Ready(expected));
                }
            }
        });
    }
}

/// A notify races the drop of one of two listeners (the arena frees its slot while the notify
/// collects wakers): the other listener is woken exactly once and resolves, and no slot is
/// left behind.
#[test]
fn signal_notify_racing_a_listener_drop_wakes_the_other_and_frees_every_slot() {
    super::model(|| {
        let signal = WakeSignal::new();
        let seen = signal.epoch();
        let (wa, a_wakes) = CountingWaker::new();
        let (wb, b_wakes) = CountingWaker::new();
        let mut a = signal.changed(seen);
        let mut b = signal.changed(seen);
        assert!(poll_once(&mut a, &wa).is_pending());
        assert!(poll_once(&mut b, &wb).is_pending());

        let signal2 = signal.clone();
        let t1 = thread::spawn(move || signal2.notify());
        drop(a);
        join(t1);

        assert!(a_wakes.wakes() <= 1, "a dropped listener woken twice");
        assert_eq!(b_wakes.wakes(), 1, "b woken exactly once");
        assert!(poll_once(&mut b, &wb).is_ready());
        assert_eq!(signal.listeners(), 0, "a slot was left behind");
    });
}

/// A listener re-polled by another task (a new waker) races a notify: whichever wins, the
/// listener is ready at once or its new waker is woken (never only the old one).
#[test]
fn signal_notify_racing_a_waker_change_loses_no_wakeup() {
    super::model(|| {
        let signal = WakeSignal::new();
        let (old, _) = CountingWaker::new();
        let (new, new_wakes) = CountingWaker::new();
        let mut listener = signal.changed(signal.epoch());
        assert!(poll_once(&mut listener, &old).is_pending());

        let signal2 = signal.clone();
        let t1 = thread::spawn(move || signal2.notify());
        let moved = poll_once(&mut listener, &new);
        join(t1);

        if moved.is_pending() {
            assert_eq!(
                new_wakes.wakes(),
                1,
                "lost wake-up: only the old waker was woken"
            );
            assert!(poll_once(&mut listener, &new).is_ready());
        }
        assert_eq!(signal.listeners(), 0);
    });
}

/// `ManualClock::advance_to` on one thread races a sleeper's first poll on another: the
/// sleeper is ready at once (it read the new time) or is woken by the advance (it registered
/// first), never asleep past its deadline; and it leaves no registration behind.
#[test]
fn manual_clock_advance_racing_a_first_poll_loses_no_wakeup() {
    super::model(|| {
        let rt = TestRuntime::new();
        let clock = rt.clock.clone();
        let t1 = thread::spawn(move || clock.advance_to(Instant::from_millis(10)));
        let (waker, wakes) = CountingWaker::new();
        let mut sleep = rt.clock.sleep_until(Instant::from_millis(10));
        let first = poll_once(&mut sleep, &waker);
        join(t1);
        if first.is_pending() {
            assert_eq!(wakes.wakes(), 1, "lost wake-up: asleep past the deadline");
            assert!(poll_once(&mut sleep, &waker).is_ready());
        }
        assert_eq!(rt.clock.sleepers(), 0, "a sleeper was left registered");
    });
}
