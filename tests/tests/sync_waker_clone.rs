//! A waker whose `clone` panics, polled into the `sync` handles' waiting futures (issue 12).
//!
//! A waker's `clone` is the runtime's code (`RawWakerVTable::clone`), and the handles call it
//! under their lock when a future first waits. Such a waker can only be built with `unsafe`,
//! which the core forbids, hence this file; the other panic tests are the core's unit tests
//! (`sync/*/panics.rs`). After the panic, the future is dropped, as the unwinding task would
//! drop it: nothing it began may stay behind (no ticket in the line, no waiter slot), and the
//! handle serves later callers in order.

use std::hash::RandomState;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};

use throttle_sansio::pending_bytes::PendingBytesConfig;
use throttle_sansio::sync::{ManualClock, PendingBytes, WakeSignal, WindowHandle};
use throttle_sansio::{Instant, WindowConfig};

/// A waker's shared state: whether its `clone` panics, and the wakes it received.
#[derive(Default)]
struct State {
    clone_panics: AtomicBool,
    wakes: AtomicUsize,
}

static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);

/// # Safety
/// `data` is an `Arc<State>` leaked by `waker` or by a previous `clone`.
unsafe fn clone(data: *const ()) -> RawWaker {
    // SAFETY: the caller passes a live `Arc<State>` pointer (the waker holds a count).
    let state = unsafe { &*data.cast::<State>() };
    if state.clone_panics.load(Ordering::SeqCst) {
        panic!("the waker's clone panics");
    }
    // SAFETY: as above; the new waker owns the count taken here.
    unsafe { Arc::increment_strong_count(data.cast::<State>()) };
    RawWaker::new(data, &VTABLE)
}

/// # Safety
/// As for `clone`; consumes the waker's count.
unsafe fn wake(data: *const ()) {
    // SAFETY: forwarded from the caller.
    unsafe {
        wake_by_ref(data);
        drop_waker(data);
    }
}

/// # Safety
/// As for `clone`.
unsafe fn wake_by_ref(data: *const ()) {
    // SAFETY: the pointer is a live `Arc<State>`.
    let state = unsafe { &*data.cast::<State>() };
    state.wakes.fetch_add(1, Ordering::SeqCst);
}

/// # Safety
/// As for `clone`; gives the waker's count back.
unsafe fn drop_waker(data: *const ()) {
    // SAFETY: each waker owns exactly one count of the `Arc`.
    drop(unsafe { Arc::from_raw(data.cast::<State>()) });
}

/// A waker over `state`.
fn waker(state: &Arc<State>) -> Waker {
    let data = Arc::into_raw(Arc::clone(state)).cast::<()>();
    // SAFETY: the vtable's functions uphold the `RawWaker` contract for this pointer: it owns
    // one count of the `Arc`, which `drop_waker` (or `wake`) gives back.
    unsafe { Waker::from_raw(RawWaker::new(data, &VTABLE)) }
}

fn poll<F: Future + Unpin>(fut: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(waker))
}

#[test]
fn a_bytes_waiter_whose_waker_clone_panics_leaves_no_ticket_in_the_line() {
    let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
    let held = h.try_acquire(10).expect("empty");
    let bad = Arc::new(State::default());
    bad.clone_panics.store(true, Ordering::SeqCst);
    let bad_waker = waker(&bad);
    let mut first = h.acquire(4);
    let polled = catch_unwind(AssertUnwindSafe(|| poll(&mut first, &bad_waker)));
    assert!(polled.is_err(), "the clone's panic reaches the poller");
    drop(first);
    assert_eq!(h.waiting(), 0, "the dropped future took its ticket with it");
    // The line is intact: the next waiters are served in order once the bytes come back.
    let good = Arc::new(State::default());
    let good_waker = waker(&good);
    let mut a = h.acquire(6);
    let mut b = h.acquire(6);
    assert!(poll(&mut a, &good_waker).is_pending());
    assert!(poll(&mut b, &good_waker).is_pending());
    assert_eq!(h.waiting(), 2);
    drop(held);
    let Poll::Ready(Ok(pa)) = poll(&mut a, &good_waker) else {
        panic!("a is admitted first");
    };
    assert!(poll(&mut b, &good_waker).is_pending(), "6 + 6 > 10");
    drop(pa);
    let Poll::Ready(Ok(pb)) = poll(&mut b, &good_waker) else {
        panic!("then b");
    };
    drop(pb);
    assert_eq!((h.used(), h.waiting()), (0, 0));
}

#[test]
fn a_bytes_waiter_whose_waker_clone_panicked_can_poll_again_and_is_served() {
    let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
    let held = h.try_acquire(10).expect("empty");
    let state = Arc::new(State::default());
    state.clone_panics.store(true, Ordering::SeqCst);
    let w = waker(&state);
    let mut first = h.acquire(4);
    assert!(catch_unwind(AssertUnwindSafe(|| poll(&mut first, &w))).is_err());
    state.clone_panics.store(false, Ordering::SeqCst);
    assert!(
        poll(&mut first, &w).is_pending(),
        "still in line, now with a waker"
    );
    drop(held);
    assert_eq!(state.wakes.load(Ordering::SeqCst), 1, "woken when admitted");
    assert!(matches!(poll(&mut first, &w), Poll::Ready(Ok(_))));
    assert_eq!(h.used(), 0);
}

#[test]
fn a_window_waiter_whose_waker_clone_panics_leaves_no_waiter_behind() {
    let h: WindowHandle<u32, RandomState> =
        WindowHandle::new(WindowConfig::default().with_max_in_flight(1)).expect("valid");
    let held = h.try_acquire(1).expect("free");
    let bad = Arc::new(State::default());
    bad.clone_panics.store(true, Ordering::SeqCst);
    let bad_waker = waker(&bad);
    let mut first = h.acquire(1);
    assert!(catch_unwind(AssertUnwindSafe(|| poll(&mut first, &bad_waker))).is_err());
    assert_eq!(h.waiting(&1), 0, "it never joined the line");
    drop(first);
    let good = Arc::new(State::default());
    let good_waker = waker(&good);
    let mut next = h.acquire(1);
    assert!(poll(&mut next, &good_waker).is_pending());
    drop(held);
    assert_eq!(
        good.wakes.load(Ordering::SeqCst),
        1,
        "the credit goes to the next waiter"
    );
    assert!(matches!(poll(&mut next, &good_waker), Poll::Ready(Ok(_))));
    assert_eq!((h.in_flight(&1), h.available(&1)), (0, 1));
}

#[test]
fn a_window_waiter_re_polled_with_a_waker_whose_clone_panics_keeps_its_place() {
    let h: WindowHandle<u32, RandomState> =
        WindowHandle::new(WindowConfig::default().with_max_in_flight(1)).expect("valid");
    let held = h.try_acquire(1).expect("free");
    let good = Arc::new(State::default());
    let good_waker = waker(&good);
    let mut first = h.acquire(1);
    assert!(poll(&mut first, &good_waker).is_pending());
    let bad = Arc::new(State::default());
    bad.clone_panics.store(true, Ordering::SeqCst);
    let bad_waker = waker(&bad);
    // Polled from another task: the new waker's clone panics.
    assert!(catch_unwind(AssertUnwindSafe(|| poll(&mut first, &bad_waker))).is_err());
    assert_eq!(h.waiting(&1), 1, "still in line");
    drop(held);
    assert_eq!(
        good.wakes.load(Ordering::SeqCst),
        1,
        "handed the credit, through the waker it had"
    );
    assert!(matches!(poll(&mut first, &good_waker), Poll::Ready(Ok(_))));
    assert_eq!((h.in_flight(&1), h.waiting(&1)), (0, 0));
}

#[test]
fn a_signal_listener_whose_waker_clone_panics_is_not_registered_and_can_poll_again() {
    let signal = WakeSignal::new();
    let bad = Arc::new(State::default());
    bad.clone_panics.store(true, Ordering::SeqCst);
    let w = waker(&bad);
    let mut changed = signal.changed(signal.epoch());
    assert!(catch_unwind(AssertUnwindSafe(|| poll(&mut changed, &w))).is_err());
    assert_eq!(signal.listeners(), 0, "no listener left by the panic");
    bad.clone_panics.store(false, Ordering::SeqCst);
    assert!(poll(&mut changed, &w).is_pending());
    assert_eq!(signal.listeners(), 1);
    signal.notify();
    assert_eq!(bad.wakes.load(Ordering::SeqCst), 1, "woken by the notify");
    assert!(poll(&mut changed, &w).is_ready());
    assert_eq!(signal.listeners(), 0);
}

#[test]
fn a_manual_sleeper_whose_waker_clone_panics_is_not_registered_and_can_poll_again() {
    let clock = ManualClock::new();
    let bad = Arc::new(State::default());
    bad.clone_panics.store(true, Ordering::SeqCst);
    let w = waker(&bad);
    let mut sleep = clock.sleep_until(Instant::from_millis(5));
    assert!(catch_unwind(AssertUnwindSafe(|| poll(&mut sleep, &w))).is_err());
    assert_eq!(
        (clock.sleepers(), clock.next_deadline()),
        (0, None),
        "no sleeper left by the panic"
    );
    bad.clone_panics.store(false, Ordering::SeqCst);
    assert!(poll(&mut sleep, &w).is_pending());
    assert_eq!(clock.next_deadline(), Some(Instant::from_millis(5)));
    clock.advance_to(Instant::from_millis(5));
    assert_eq!(bad.wakes.load(Ordering::SeqCst), 1, "woken at its deadline");
    assert!(poll(&mut sleep, &w).is_ready());
    assert_eq!(clock.sleepers(), 0);
}
