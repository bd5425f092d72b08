//! Pending bytes when a waker panics (issue 12): the handle runs no other user code (no keys,
//! no closures; a waker's `clone`, which the core cannot make panic without `unsafe`, is
//! covered in `tests/tests/sync_waker_clone.rs`). After a waker panicked, every other waiter
//! is still woken, the bytes are conserved and the line moves in FIFO order.

use alloc::boxed::Box;
use alloc::vec::Vec;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::*;
use crate::sync::panic_support::{PanickingWaker, close_while_listened};
use crate::sync::test_support::{CountingWaker, WakeCount, poll_once};

struct Waiter {
    fut: AcquireBytes,
    waker: Waker,
    wakes: WakeCount,
}

impl Waiter {
    fn new(h: &PendingBytes, n: u64, (waker, wakes): (Waker, WakeCount)) -> Self {
        let mut w = Waiter {
            fut: h.acquire(n),
            waker,
            wakes,
        };
        assert!(w.poll().is_pending(), "the limiter is full");
        w
    }

    fn poll(&mut self) -> Poll<Result<BytesPermit, Closed>> {
        poll_once(&mut self.fut, &self.waker)
    }

    fn permit(&mut self) -> BytesPermit {
        match self.poll() {
            Poll::Ready(Ok(p)) => p,
            _ => panic!("expected a permit"),
        }
    }
}

/// Bytes are conserved: `used` is exactly what the live permits hold, plus grants that
/// waiters have not observed yet.
fn assert_conserved(h: &PendingBytes, permits: &[&BytesPermit]) {
    let st = lock(&h.shared);
    let unobserved: u64 = st
        .waiters
        .iter()
        .filter_map(|(_, e)| match e {
            Entry::Granted(g) => Some(g.charged()),
            _ => None,
        })
        .sum();
    let held: u64 = permits.iter().map(|p| p.charged()).sum();
    assert_eq!(st.limiter.used(), held + unobserved, "bytes conserved");
    assert_eq!(st.refused_releases, 0);
}

#[test]
fn a_panicking_waker_is_still_admitted_and_the_waiters_behind_it_are_woken() {
    let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
    let held = h.try_acquire(10).expect("empty");
    let mut bad = Waiter::new(&h, 4, PanickingWaker::new());
    let mut good = Waiter::new(&h, 4, CountingWaker::new());
    let mut last = Waiter::new(&h, 4, CountingWaker::new());
    let released = catch_unwind(AssertUnwindSafe(|| held.release()));
    assert!(released.is_ok(), "the release returns normally");
    assert_eq!(
        (bad.wakes.wakes(), good.wakes.wakes()),
        (1, 1),
        "both admitted and woken"
    );
    assert_eq!(last.wakes.wakes(), 0, "4 + 4 + 4 > 10: the third waits");
    assert_conserved(&h, &[]);
    let (pb, pg) = (bad.permit(), good.permit());
    assert_conserved(&h, &[&pb, &pg]);
    drop(pb);
    assert_eq!(last.wakes.wakes(), 1, "the line moves on");
    let pl = last.permit();
    assert_conserved(&h, &[&pg, &pl]);
    drop((pg, pl));
    assert_eq!((h.used(), h.waiting()), (0, 0));
}

#[test]
fn close_wakes_every_waiter_and_the_closed_listener_even_if_a_waker_panics() {
    let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
    let held = h.try_acquire(10).expect("empty");
    let mut waiters: Vec<Waiter> = (0..3)
        .map(|i| {
            let waker = if i == 1 {
                PanickingWaker::new()
            } else {
                CountingWaker::new()
            };
            Waiter::new(&h, 4, waker)
        })
        .collect();
    let (mut closed, w, closed_wakes) = close_while_listened(h.closed(), || h.close());
    for w in &mut waiters {
        assert_eq!(w.wakes.wakes(), 1, "every waiter woken");
        assert!(matches!(w.poll(), Poll::Ready(Err(Closed))));
    }
    // The last release after close: the `closed()` listener's wake runs after the waiters'.
    let released = catch_unwind(AssertUnwindSafe(|| held.release()));
    assert!(released.is_ok());
    assert_eq!(closed_wakes.wakes(), 1);
    assert!(poll_once(&mut closed, &w).is_ready());
}

#[test]
fn a_release_whose_waiter_and_closed_listener_both_panic_still_wakes_both() {
    let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
    let held = h.try_acquire(10).expect("empty");
    let mut granted = Waiter::new(&h, 10, PanickingWaker::new());
    // Closed with a grant outstanding, then a listener whose waker panics, then one that counts.
    drop(held); // admits `granted`, whose wake panics
    assert_eq!(granted.wakes.wakes(), 1);
    let p = granted.permit();
    h.close();
    let (bad, bad_wakes) = PanickingWaker::new();
    let (good, good_wakes) = CountingWaker::new();
    let mut first = Box::pin(h.closed());
    let mut second = Box::pin(h.closed());
    assert!(poll_once(&mut first, &bad).is_pending());
    assert!(poll_once(&mut second, &good).is_pending());
    assert!(catch_unwind(AssertUnwindSafe(|| p.release())).is_ok());
    assert_eq!((bad_wakes.wakes(), good_wakes.wakes()), (1, 1));
    assert!(poll_once(&mut second, &good).is_ready());
}
