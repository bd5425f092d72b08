//! The pending-bytes handle: admissions, cancellations and close.

use core::task::Poll;

use loom::thread;

use super::support::{in_line, ready_at_once, served_now_or_after_one_wake, woken_once_and_served};
use super::{Hand, boxed, join};
use crate::pending_bytes::PendingBytesConfig;
use crate::sync::test_support::{CountingWaker, poll_once};
use crate::sync::{Closed, PendingBytes};

fn bytes(limit: u64) -> PendingBytes {
    PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(limit))
}

fn held(h: &PendingBytes, n: u64) -> crate::sync::BytesPermit {
    match h.try_acquire(n) {
        Some(p) => p,
        None => panic!("{n} B should fit"),
    }
}

/// A limit of 10 bytes, all held: an acquire of them waits.
fn full() -> (PendingBytes, crate::sync::BytesPermit) {
    let h = bytes(10);
    let first = held(&h, 10);
    (h, first)
}

/// The end state once every permit is gone: no byte used or granted, nobody in line, no
/// grant released twice, and `closed()` ready if the handle was closed.
fn assert_settled(h: &PendingBytes) {
    assert_eq!(h.used(), 0, "bytes were lost");
    assert_eq!(h.waiting(), 0, "a ticket was left in line");
    assert_eq!(h.refused_releases(), 0, "a grant was released twice");
    if h.is_closed() {
        assert!(
            ready_at_once(h.closed()),
            "closed() pending with nothing granted"
        );
    }
}

/// A bytes waiter is cancelled while a release admits it: its bytes go to the next waiter,
/// once (the limiter's `cancel` releases an admitted ticket).
#[test]
fn bytes_waiter_cancelled_racing_its_admission_passes_the_bytes_on() {
    super::model(|| {
        let (h, first) = full();
        let [a, mut b] = in_line(|| h.acquire(10));

        let t1 = thread::spawn(move || drop(first));
        let t2 = thread::spawn(move || drop(a.fut));
        join(t1);
        join(t2);

        let pb = woken_once_and_served(&mut b, "b", "bytes");
        assert_eq!(h.used(), 10);
        drop(pb);
        assert_settled(&h);
    });
}

/// `close` races the release that admits a waiter (`close` ∥ admission), while `closed()`
/// is polled (and a second one first polled): whichever comes first, the waiter is woken and
/// resolves to `Closed` (it never observed its grant before the close), the grant comes back,
/// and `closed()` resolves once both have happened and not before.
#[test]
fn bytes_close_racing_an_admission_takes_the_grant_back() {
    super::model(|| {
        let (h, first) = full();
        let mut a = Hand::new(h.acquire(10));
        assert!(a.poll().is_pending());
        let mut closed = Hand::new(boxed({
            let h = h.clone();
            async move { h.closed().await }
        }));
        assert!(closed.poll().is_pending());

        let h2 = h.clone();
        let t1 = thread::spawn(move || drop(first));
        let t2 = thread::spawn(move || h2.close());
        let early = closed.poll();
        let fresh = Hand::new(boxed(h.closed())).poll();
        if early.is_ready() || fresh.is_ready() {
            assert!(
                h.is_closed() && h.used() == 0,
                "closed() resolved with bytes granted"
            );
        }
        join(t1);
        join(t2);

        assert!(a.wakes() >= 1, "the waiter was left unwoken");
        assert!(
            matches!(a.poll(), Poll::Ready(Err(Closed))),
            "a grant reached a waiter after close"
        );
        if early.is_pending() {
            assert!(closed.wakes() >= 1, "lost wake-up: closed() never woken");
            assert!(
                closed.poll().is_ready(),
                "closed() pending after the last release"
            );
        }
        assert!(h.try_acquire(0).is_none(), "admitted after close");
        assert_settled(&h);
    });
}

/// `close` races two waiters that were admitted but have not looked yet (`close` ∥ a grant
/// no waiter has observed): one observes its grant on the main thread, the other is cancelled
/// on a second thread. Either the waiter sees its grant first (a permit, valid after the
/// close) or the close takes the grant back (`Closed`); the cancelled waiter's grant comes
/// back once, from the close or from its drop; no byte is lost.
#[test]
fn bytes_close_racing_an_unobserved_grant_gives_every_byte_back() {
    super::model(|| {
        let (h, first) = full();
        let mut a = Hand::new(h.acquire(5));
        let mut b = Hand::new(h.acquire(5));
        assert!(a.poll().is_pending() && b.poll().is_pending());
        drop(first); // admits both; neither has looked
        assert_eq!((a.wakes(), b.wakes(), h.used()), (1, 1, 10));

        let h1 = h.clone();
        let t1 = thread::spawn(move || h1.close());
        let t2 = thread::spawn(move || drop(b));
        let seen = a.poll();
        join(t1);
        join(t2);

        match seen {
            Poll::Ready(Ok(p)) => {
                assert_eq!(h.used(), 5, "only a's permit holds bytes");
                drop(p);
            }
            Poll::Ready(Err(Closed)) => {}
            Poll::Pending => panic!("an admitted waiter stayed pending"),
        }
        assert_settled(&h);
    });
}

/// Two bytes waiters cancelled on two threads race the release that admits the first: the
/// bytes skip both and reach the third waiter, woken exactly once.
#[test]
fn bytes_two_cancellations_racing_one_release_admit_the_third_waiter() {
    super::model(|| {
        let (h, first) = full();
        let [a, b, mut c] = in_line(|| h.acquire(10));

        let t1 = thread::spawn(move || drop(a.fut));
        let t2 = thread::spawn(move || drop(b.fut));
        drop(first);
        join(t1);
        join(t2);

        let pc = woken_once_and_served(&mut c, "c", "bytes");
        assert_eq!(h.used(), 10);
        drop(pc);
        assert_settled(&h);
    });
}

/// A bytes waiter re-polled with a new waker races the release that admits it: it is ready
/// at once, or its new waker is woken.
#[test]
fn bytes_waker_replaced_racing_an_admission_wakes_the_new_waker() {
    super::model(|| {
        let (h, first) = full();
        let (new, new_wakes) = CountingWaker::new();
        // First polled with its own waker (the old one).
        let [mut a] = in_line(|| h.acquire(10));

        let t1 = thread::spawn(move || drop(first));
        let moved = poll_once(&mut a.fut, &new);
        join(t1);

        let pa = served_now_or_after_one_wake(
            moved,
            &mut a.fut,
            (&new, &new_wakes),
            "lost wake-up: only the old waker was woken",
            "woken but not admitted",
        );
        assert_eq!(h.used(), 10);
        drop(pa);
        assert_settled(&h);
    });
}
