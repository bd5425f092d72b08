//! loom models of the races in `sync`, one race per model, driving the production handles.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p throttle-core --features std
//! --lib --release loom_models` (the gate's model lives at the bottom of `gate.rs`). Futures are
//! polled by hand with counting wakers (no executor); `WindowHandle::stats` exposes, for tests
//! only, the count of releases the window refused (a double release) and the peak credits in
//! flight per shard.

use alloc::boxed::Box;
use core::task::{Context, Poll};

use loom::thread;

use super::loom::{Arc, Mutex, lock};
use super::test_support::{CountingWaker, TestRuntime, poll_once, repoll_while_woken};
use super::{Closed, PendingBytes, Released, WakeSignal, WindowHandle, wait_until};
use crate::dispatch_window::WindowConfig;
use crate::pending_bytes::PendingBytesConfig;
use crate::test_hasher::TestHasher;
use crate::time::Instant;

type Handle = WindowHandle<u32, TestHasher>;

fn window(cap: u32) -> Handle {
    match Handle::with_hasher(
        WindowConfig::default().with_max_in_flight(cap),
        TestHasher::default(),
    ) {
        Ok(h) => h,
        Err(e) => panic!("valid config refused: {e}"),
    }
}

fn permit(h: &Handle) -> super::OwnedPermit<u32, TestHasher> {
    match h.try_acquire_owned(0) {
        Ok(p) => p,
        Err(e) => panic!("expected free credit: {e}"),
    }
}

/// Completion, drop and close race on the permits of one shard while a waiter waits: every
/// credit is released exactly once (the window refuses none), the shard never exceeds its
/// capacity, and the waiter resolves (a permit or `Closed`) after being woken.
#[test]
fn permit_complete_drop_and_close_release_every_credit_once() {
    loom::model(|| {
        let h = window(2);
        let (p1, p2) = (permit(&h), permit(&h));
        let (waker, wakes) = CountingWaker::new();
        let mut waiter = h.acquire_owned(0);
        assert!(poll_once(&mut waiter, &waker).is_pending());

        let t1 = thread::spawn(move || {
            let _ = p1.complete();
        });
        let t2 = thread::spawn(move || drop(p2));
        let early = poll_once(&mut waiter, &waker);
        h.close();
        let _ = t1.join();
        let _ = t2.join();

        let outcome = match early {
            Poll::Pending => poll_once(&mut waiter, &waker),
            ready => ready,
        };
        match outcome {
            Poll::Ready(Ok(p)) => drop(p),
            Poll::Ready(Err(Closed)) => {}
            Poll::Pending => panic!("waiter left pending after close"),
        }
        assert!(wakes.wakes() >= 1, "the waiter was woken");
        let stats = h.stats();
        assert_eq!(stats.refused_releases, 0, "a credit was released twice");
        assert!(
            stats.peak_in_flight <= 2,
            "over capacity: {}",
            stats.peak_in_flight
        );
        assert_eq!(h.live_credits(), 0, "a credit was lost");
    });
}

/// A waiter is cancelled while the release hands it the credit: the credit reaches the next
/// waiter, exactly once.
#[test]
fn cancelled_waiter_racing_the_handoff_passes_the_credit_on() {
    loom::model(|| {
        let h = window(1);
        let p = permit(&h);
        let (wa, _) = CountingWaker::new();
        let (wb, b_wakes) = CountingWaker::new();
        let mut a = h.acquire_owned(0);
        let mut b = h.acquire_owned(0);
        assert!(poll_once(&mut a, &wa).is_pending());
        assert!(poll_once(&mut b, &wb).is_pending());

        let t1 = thread::spawn(move || {
            let _ = p.complete();
        });
        let t2 = thread::spawn(move || drop(a));
        let _ = t1.join();
        let _ = t2.join();

        assert_eq!(b_wakes.wakes(), 1, "b woken exactly once");
        let Poll::Ready(Ok(pb)) = poll_once(&mut b, &wb) else {
            panic!("the credit did not reach b");
        };
        let stats = h.stats();
        assert_eq!(h.in_flight(&0), 1);
        assert_eq!(stats.peak_in_flight, 1, "the credit was duplicated");
        assert_eq!(pb.complete(), Released::Freed);
        assert_eq!((h.live_credits(), h.stats().refused_releases), (0, 0));
    });
}

/// A release races the first poll of a new acquire: whichever wins, the acquirer ends with the
/// credit (at once, or woken by the hand-off): no lost wake-up.
#[test]
fn release_racing_a_first_poll_loses_no_wakeup() {
    loom::model(|| {
        let h = window(1);
        let p = permit(&h);
        let t1 = thread::spawn(move || {
            let _ = p.complete();
        });
        let (waker, wakes) = CountingWaker::new();
        let mut w = h.acquire_owned(0);
        let first = poll_once(&mut w, &waker);
        let _ = t1.join();
        let permit = match first {
            Poll::Ready(Ok(p)) => p,
            Poll::Ready(Err(e)) => panic!("{e}"),
            Poll::Pending => {
                assert_eq!(wakes.wakes(), 1, "lost wake-up");
                match poll_once(&mut w, &waker) {
                    Poll::Ready(Ok(p)) => p,
                    _ => panic!("woken but no credit"),
                }
            }
        };
        drop(permit);
        assert_eq!((h.live_credits(), h.stats().refused_releases), (0, 0));
    });
}

/// A release races a newcomer while an older waiter waits: the older waiter gets the credit,
/// the newcomer waits behind it (FIFO), and is served by the next release.
#[test]
fn release_racing_a_newcomer_serves_the_older_waiter_first() {
    loom::model(|| {
        let h = window(1);
        let p = permit(&h);
        let (wa, a_wakes) = CountingWaker::new();
        let mut a = h.acquire_owned(0);
        assert!(poll_once(&mut a, &wa).is_pending());
        let t1 = thread::spawn(move || {
            let _ = p.complete();
        });
        let (wb, b_wakes) = CountingWaker::new();
        let mut b = h.acquire_owned(0);
        let b_first = poll_once(&mut b, &wb);
        let _ = t1.join();

        assert!(b_first.is_pending(), "the newcomer barged past the waiter");
        assert_eq!(a_wakes.wakes(), 1);
        let Poll::Ready(Ok(pa)) = poll_once(&mut a, &wa) else {
            panic!("the older waiter was not served");
        };
        assert!(poll_once(&mut b, &wb).is_pending());
        assert_eq!(pa.complete(), Released::HandedOn);
        assert_eq!(b_wakes.wakes(), 1);
        assert!(matches!(poll_once(&mut b, &wb), Poll::Ready(Ok(_))));
        assert_eq!((h.live_credits(), h.stats().refused_releases), (0, 0));
    });
}

/// A bytes waiter is cancelled while a release admits it: its bytes go to the next waiter,
/// once (the limiter's `cancel` releases an admitted ticket).
#[test]
fn bytes_waiter_cancelled_racing_its_admission_passes_the_bytes_on() {
    loom::model(|| {
        let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
        let Some(held) = h.try_acquire(10) else {
            panic!("10 B fit in 10 B");
        };
        let (wa, _) = CountingWaker::new();
        let (wb, b_wakes) = CountingWaker::new();
        let mut a = h.acquire(10);
        let mut b = h.acquire(10);
        assert!(poll_once(&mut a, &wa).is_pending());
        assert!(poll_once(&mut b, &wb).is_pending());

        let t1 = thread::spawn(move || drop(held));
        let t2 = thread::spawn(move || drop(a));
        let _ = t1.join();
        let _ = t2.join();

        assert_eq!(b_wakes.wakes(), 1, "b woken exactly once");
        let Poll::Ready(Ok(pb)) = poll_once(&mut b, &wb) else {
            panic!("the bytes did not reach b");
        };
        assert_eq!(h.used(), 10);
        drop(pb);
        assert_eq!((h.used(), h.waiting(), h.refused_releases()), (0, 0, 0));
    });
}

/// The gate's wake signal races a sleeper that is reading the gate and arming its timer: the
/// sleeper ends up with its timer at the new, earlier opening (never asleep on the old one).
#[test]
fn wake_signal_racing_a_sleeper_rearms_its_timer_at_the_earlier_opening() {
    loom::model(|| {
        let rt = TestRuntime::new();
        let signal = WakeSignal::new();
        // Stand-in for a gated bucket until the write gate handle exists: closed until then.
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
        let _ = t1.join();
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
        loom::model(move || {
            let (tx, mut rx) = super::oneshot::channel::<u32>();
            let t = thread::spawn(move || {
                if send {
                    tx.send(7);
                } else {
                    drop(tx);
                }
            });
            let (waker, count) = CountingWaker::new();
            let first = poll_once(&mut rx, &waker);
            if t.join().is_err() {
                panic!("sender thread panicked");
            }
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
    loom::model(|| {
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
        let _ = t1.join();

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
    loom::model(|| {
        let signal = WakeSignal::new();
        let (old, _) = CountingWaker::new();
        let (new, new_wakes) = CountingWaker::new();
        let mut listener = signal.changed(signal.epoch());
        assert!(poll_once(&mut listener, &old).is_pending());

        let signal2 = signal.clone();
        let t1 = thread::spawn(move || signal2.notify());
        let moved = poll_once(&mut listener, &new);
        let _ = t1.join();

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

/// `close` on one thread races the last permit's release on another while a `closed()`
/// waiter polls: it never resolves before both have happened, and once both have it is
/// woken (or was ready already), so a graceful shutdown neither ends early nor hangs.
#[test]
fn window_closed_resolves_after_close_and_the_last_release_and_not_before() {
    loom::model(|| {
        let h = window(1);
        let p = permit(&h);
        let (waker, wakes) = CountingWaker::new();
        let mut closed = Box::pin({
            let h = h.clone();
            async move { h.closed().await }
        });
        assert!(poll_once(&mut closed, &waker).is_pending());

        let h1 = h.clone();
        let t1 = thread::spawn(move || h1.close());
        let t2 = thread::spawn(move || {
            let _ = p.complete();
        });
        let early = poll_once(&mut closed, &waker);
        if early.is_ready() {
            assert!(
                h.is_closed() && h.live_credits() == 0,
                "closed() resolved before the close and the last release"
            );
        }
        let _ = t1.join();
        let _ = t2.join();

        if early.is_pending() {
            assert!(
                wakes.wakes() >= 1,
                "lost wake-up: the waiter was never woken"
            );
            assert!(poll_once(&mut closed, &waker).is_ready());
        }
        assert_eq!(h.live_credits(), 0);
    });
}
