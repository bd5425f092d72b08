//! Unit tests of the window handle.

use super::*;
use crate::sync::test_support::{CountingWaker, Executor, WakeCount, poll_once};
use crate::test_hasher::TestHasher;
use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use std::sync::Mutex as StdMutex;

type Handle = WindowHandle<u32, TestHasher>;

fn handle(cap: u32) -> Handle {
    match Handle::with_hasher(
        WindowConfig::default().with_max_in_flight(cap as usize),
        TestHasher::default(),
    ) {
        Ok(h) => h,
        Err(e) => panic!("valid config refused: {e}"),
    }
}

/// A hasher builder whose clones hash differently from the original (each clone gets the
/// next seed): legal, if odd, so the handle must not trust its own clone's hashes.
#[derive(Default)]
struct DriftingHasher(u64);

impl Clone for DriftingHasher {
    fn clone(&self) -> Self {
        DriftingHasher(self.0.wrapping_add(1))
    }
}

impl BuildHasher for DriftingHasher {
    type Hasher = crate::test_hasher::FnvHasher;
    fn build_hasher(&self) -> Self::Hasher {
        let mut h = crate::test_hasher::FnvHasher::default();
        core::hash::Hasher::write_u64(&mut h, self.0);
        h
    }
}

#[test]
fn a_hint_that_finds_its_shard_is_not_trusted_after_the_table_grows() {
    // Keys whose two hashes (the handle's clone, the window's) share hashbrown's 7-bit tag:
    // in a small table the wrong hint still finds the entry. The credit must remember the
    // hash that placed the entry, or its release misses the shard once the table grows.
    let tag = |seed: u64, k: u32| DriftingHasher(seed).hash_one(k) >> 57;
    let keys: Vec<u32> = (0..100_000)
        .filter(|&k| tag(7, k) == tag(8, k))
        .take(8)
        .collect();
    assert_eq!(keys.len(), 8);
    for k in keys {
        let h: WindowHandle<u32, DriftingHasher> = match WindowHandle::with_hasher(
            WindowConfig::default().with_max_in_flight(1),
            DriftingHasher(7),
        ) {
            Ok(h) => h,
            Err(e) => panic!("valid config refused: {e}"),
        };
        drop(h.try_acquire(k).expect("free credit")); // the entry stays, idle
        let p = h.try_acquire(k).expect("free credit");
        // Forty more active shards: the table grows and every entry moves.
        let others: Vec<_> = (1_000_000..1_000_040)
            .map(|o| h.try_acquire(o).expect("free credit"))
            .collect();
        assert_eq!(p.complete(), Released::Freed);
        assert_eq!(h.in_flight(&k), 0, "key {k}: the release found its shard");
        let again = h.try_acquire(k).expect("the credit is free again");
        drop(again);
        drop(others);
        assert_eq!(h.live_credits(), 0);
        assert_eq!(h.total(|st| st.window.shard_count()), 0);
    }
}

#[test]
fn running_out_of_credit_ids_closes_the_handle_on_every_path() {
    let (waker, count) = CountingWaker::new();
    let spend_ids = |h: &Handle| {
        h.total(|st| {
            st.window.skip_generations_to(u64::MAX);
            0
        })
    };

    // A release that would hand a fresh credit to a waiter finds no id left.
    let h = handle(1);
    let p = h.try_acquire(1).expect("free credit");
    let mut waiter = h.acquire(1);
    assert!(poll_once(&mut waiter, &waker).is_pending());
    spend_ids(&h);
    assert_eq!(p.complete(), Released::Freed);
    assert_eq!(count.wakes(), 1, "the failed waiter is woken");
    assert!(matches!(
        poll_once(&mut waiter, &waker),
        Poll::Ready(Err(Closed))
    ));
    assert!(h.is_closed());
    assert_eq!(h.live_credits(), 0);

    // try_acquire finds no id left.
    let h = handle(1);
    let mut other = h.acquire(2); // made before, first polled after the close
    let held = h.try_acquire(3).expect("free credit");
    let mut queued = h.acquire(3);
    assert!(poll_once(&mut queued, &waker).is_pending());
    spend_ids(&h);
    assert_eq!(h.try_acquire(4).unwrap_err(), TryAcquireError::Closed);
    assert!(h.is_closed());
    assert!(matches!(
        poll_once(&mut queued, &waker),
        Poll::Ready(Err(Closed))
    ));
    assert!(matches!(
        poll_once(&mut other, &waker),
        Poll::Ready(Err(Closed))
    ));
    drop(held);

    // The first poll of an acquire finds no id left.
    let h = handle(1);
    let held = h.try_acquire(5).expect("free credit");
    let mut queued = h.acquire(5);
    assert!(poll_once(&mut queued, &waker).is_pending());
    spend_ids(&h);
    let mut fresh = h.acquire(6);
    assert!(matches!(
        poll_once(&mut fresh, &waker),
        Poll::Ready(Err(Closed))
    ));
    assert!(h.is_closed());
    assert!(matches!(
        poll_once(&mut queued, &waker),
        Poll::Ready(Err(Closed))
    ));
    assert_eq!(held.complete(), Released::Freed);
    assert_eq!(h.live_credits(), 0);
    assert_eq!(h.stats().refused_releases, 0);
}

#[test]
fn borrowed_permits_release_exactly_once_and_hand_off_like_owned_ones() {
    let h = handle(2);
    // complete, then the drop that follows: one release.
    let a = h.try_acquire(1).expect("free credit");
    assert_eq!(a.complete(), Released::Freed);
    // dropping releases too.
    let b = h.try_acquire(1).expect("free credit");
    drop(b);
    assert_eq!(h.available(&1), 2);

    // Borrowed and owned permits share the shard's credits.
    let c = h.try_acquire(1).expect("free credit");
    let d = h.try_acquire_owned(1).expect("free credit");
    assert_eq!(h.try_acquire(1).unwrap_err(), TryAcquireError::NoCredit);

    // A borrowed waiter is served in line, before a newcomer, and resolves to a permit.
    let (waker, count) = CountingWaker::new();
    let mut first = h.acquire(1);
    let mut second = h.acquire(1);
    assert!(poll_once(&mut first, &waker).is_pending());
    assert!(poll_once(&mut second, &waker).is_pending());
    assert_eq!(h.waiting(&1), 2);
    assert_eq!(c.complete(), Released::HandedOn);
    assert_eq!(count.wakes(), 1);
    let Poll::Ready(Ok(e)) = poll_once(&mut first, &waker) else {
        panic!("the first waiter is served first");
    };
    // Cancelled after its credit was handed over, the second waiter passes it on.
    drop(d);
    assert_eq!(h.waiting(&1), 0);
    drop(second);
    assert_eq!(
        h.in_flight(&1),
        1,
        "the cancelled waiter's credit went back"
    );
    assert_eq!(e.complete(), Released::Freed);
    assert_eq!(h.available(&1), 2);
    assert_eq!(h.live_credits(), 0);
    assert_eq!(h.stats().refused_releases, 0);
}

#[test]
fn a_hasher_clone_that_hashes_differently_costs_a_lookup_not_a_second_window() {
    // The handle hashes with the original, the window with a clone: every hint is wrong.
    let h: WindowHandle<u32, DriftingHasher> = match WindowHandle::with_hasher(
        WindowConfig::default().with_max_in_flight(2),
        DriftingHasher(7),
    ) {
        Ok(h) => h,
        Err(e) => panic!("valid config refused: {e}"),
    };
    let a = h.try_acquire(5).expect("first credit");
    let b = h.try_acquire(5).expect("second credit");
    // A second entry for shard 5 would have handed out a third credit here.
    assert_eq!(h.try_acquire(5).unwrap_err(), TryAcquireError::NoCredit);
    assert_eq!(h.in_flight(&5), 2);
    assert_eq!(h.total(|st| st.window.tracked_shards()), 1);
    // The hand-off to a waiter goes through the same hint.
    let (waker, _count) = CountingWaker::new();
    let mut waiter = h.acquire(5);
    assert!(poll_once(&mut waiter, &waker).is_pending());
    assert_eq!(a.complete(), Released::HandedOn);
    assert_eq!(h.try_acquire(5).unwrap_err(), TryAcquireError::NoCredit);
    let Poll::Ready(Ok(again)) = poll_once(&mut waiter, &waker) else {
        panic!("the handed-on credit resolves the waiter");
    };
    assert_eq!(h.in_flight(&5), 2);
    let _ = b.complete();
    let _ = again.complete();
    assert_eq!(h.available(&5), 2);
    assert_eq!(h.live_credits(), 0);
}

/// A future polled by hand, with its own counting waker.
struct Polled {
    fut: Acquire<'static, u32, TestHasher>,
    waker: Waker,
    count: WakeCount,
}

impl Polled {
    fn new(h: &Handle, shard: u32) -> Self {
        let (waker, count) = CountingWaker::new();
        Polled {
            fut: h.acquire_owned(shard),
            waker,
            count,
        }
    }
    fn poll(&mut self) -> Poll<Result<OwnedPermit<u32, TestHasher>, Closed>> {
        poll_once(&mut self.fut, &self.waker)
    }
    fn permit(&mut self) -> OwnedPermit<u32, TestHasher> {
        match self.poll() {
            Poll::Ready(Ok(p)) => p,
            Poll::Ready(Err(e)) => panic!("expected a permit, got {e}"),
            Poll::Pending => panic!("expected a permit, still pending"),
        }
    }
}

fn check_conserved(h: &Handle, shard: u32) {
    assert_eq!(h.in_flight(&shard) + h.available(&shard), h.capacity());
    assert!(h.available(&shard) == 0 || h.waiting(&shard) == 0);
    assert_eq!(h.stats().refused_releases, 0);
}

#[test]
fn five_submitters_on_a_window_of_two_are_served_in_arrival_order() {
    let h = handle(2);
    let mut w: vec::Vec<Polled> = (0..5).map(|_| Polled::new(&h, 1)).collect();
    let mut held = vec::Vec::new();
    for (i, p) in w.iter_mut().enumerate() {
        match p.poll() {
            Poll::Ready(Ok(permit)) => held.push((i, permit)),
            Poll::Pending => {}
            Poll::Ready(Err(e)) => panic!("{e}"),
        }
    }
    assert_eq!(
        held.iter().map(|(i, _)| *i).collect::<vec::Vec<_>>(),
        [0, 1]
    );
    assert_eq!(h.waiting(&1), 3);
    let mut served = vec![0, 1];
    while !held.is_empty() {
        let (_, permit) = held.remove(0);
        let before: vec::Vec<usize> = w.iter().map(|p| p.count.wakes()).collect();
        let released = permit.complete();
        let woken: vec::Vec<usize> = (0..5).filter(|&i| w[i].count.wakes() > before[i]).collect();
        check_conserved(&h, 1);
        match woken.as_slice() {
            [] => assert_eq!(released, Released::Freed),
            [i] => {
                assert_eq!(released, Released::HandedOn);
                assert_eq!(*i, served.len(), "the oldest waiter is woken, and only it");
                served.push(*i);
                let permit = w[*i].permit();
                held.push((*i, permit));
            }
            more => panic!("one release woke {more:?}"),
        }
        assert!(h.stats().peak_in_flight <= 2);
    }
    assert_eq!(served, [0, 1, 2, 3, 4]);
    assert_eq!((h.in_flight(&1), h.live_credits()), (0, 0));
}

#[test]
fn spawned_submitters_complete_in_fifo_order_on_the_test_executor() {
    let h = handle(2);
    let log = std::sync::Arc::new(StdMutex::new(vec::Vec::new()));
    let mut ex = Executor::default();
    for i in 0..5u32 {
        let (h, log) = (h.clone(), std::sync::Arc::clone(&log));
        ex.spawn(async move {
            let Ok(permit) = h.acquire_owned(1).await else {
                return;
            };
            if let Ok(mut l) = log.lock() {
                l.push(i);
            }
            YieldOnce(false).await; // hold the credit across a suspension
            let _ = permit.complete();
        });
    }
    assert_eq!(ex.run_until_stalled(), 0, "every task finished");
    assert_eq!(
        log.lock().map(|l| l.clone()).unwrap_or_default(),
        [0, 1, 2, 3, 4]
    );
    assert!(h.stats().peak_in_flight <= 2);
    assert_eq!(h.live_credits(), 0);
}

/// Pending once (waking itself), then ready.
struct YieldOnce(bool);
impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[test]
fn cancelled_waiter_leaves_the_line_and_the_next_one_is_served() {
    let h = handle(1);
    let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
    let mut a = Polled::new(&h, 1);
    let mut b = Polled::new(&h, 1);
    assert!(a.poll().is_pending() && b.poll().is_pending());
    drop(a);
    assert_eq!(h.waiting(&1), 1);
    assert_eq!(first.complete(), Released::HandedOn);
    assert_eq!(b.count.wakes(), 1);
    let permit = b.permit();
    assert_eq!(permit.shard(), &1);
    check_conserved(&h, 1);
    drop(permit);
    assert_eq!(h.live_credits(), 0);
}

#[test]
fn waiter_dropped_after_credit_was_handed_to_it_passes_the_credit_on() {
    let h = handle(1);
    let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
    let mut a = Polled::new(&h, 1);
    let mut b = Polled::new(&h, 1);
    assert!(a.poll().is_pending() && b.poll().is_pending());
    assert_eq!(first.complete(), Released::HandedOn); // to `a`, which never looks
    assert_eq!((a.count.wakes(), b.count.wakes()), (1, 0));
    drop(a);
    assert_eq!(b.count.wakes(), 1, "the credit moved on to b");
    let permit = b.permit();
    assert_eq!(h.in_flight(&1), 1, "one credit: not lost, not duplicated");
    check_conserved(&h, 1);
    drop(permit);
    assert_eq!(h.live_credits(), 0);
}

#[test]
fn close_fails_waiters_and_later_acquires_and_held_permits_still_release_once() {
    let h = handle(1);
    let held = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
    let mut a = Polled::new(&h, 1);
    let mut b = Polled::new(&h, 2);
    let mut c = Polled::new(&h, 1);
    assert!(a.poll().is_pending());
    let b_permit = b.permit();
    assert!(c.poll().is_pending());
    assert_eq!(b_permit.complete(), Released::Freed);
    // Hand a credit to `a` that it has not observed; close must take it back.
    assert_eq!(held.complete(), Released::HandedOn);
    h.close();
    assert!(h.is_closed());
    assert_eq!(c.count.wakes(), 1, "close wakes the waiters");
    assert!(matches!(a.poll(), Poll::Ready(Err(Closed))));
    assert!(matches!(c.poll(), Poll::Ready(Err(Closed))));
    assert!(matches!(
        Polled::new(&h, 1).poll(),
        Poll::Ready(Err(Closed))
    ));
    assert_eq!(h.try_acquire(3).unwrap_err(), TryAcquireError::Closed);
    assert_eq!((h.live_credits(), h.in_flight(&1)), (0, 0));
    assert_eq!(h.stats().refused_releases, 0);
}

#[test]
fn permit_held_across_close_releases_exactly_once() {
    let h = handle(2);
    let p = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
    let q = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
    h.close();
    h.close(); // idempotent
    assert_eq!(h.live_credits(), 2);
    assert_eq!(p.complete(), Released::Freed);
    drop(q);
    assert_eq!(h.live_credits(), 0);
    assert_eq!(
        h.stats().refused_releases,
        0,
        "complete + Drop released once"
    );
}

#[test]
fn try_acquire_never_barges_past_a_waiter() {
    let h = handle(1);
    let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
    let mut a = Polled::new(&h, 1);
    assert!(a.poll().is_pending());
    assert_eq!(first.complete(), Released::HandedOn);
    assert_eq!(h.try_acquire(1).unwrap_err(), TryAcquireError::NoCredit);
    let permit = a.permit();
    drop(permit);
    assert!(
        h.try_acquire(1).is_ok(),
        "free again once the line is empty"
    );
}

#[test]
fn an_exhausted_shard_never_delays_another() {
    let h = handle(1);
    let _p1 = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
    let mut w1 = Polled::new(&h, 1);
    assert!(w1.poll().is_pending());
    let p2 = Polled::new(&h, 2).permit();
    assert_eq!(
        p2.complete(),
        Released::Freed,
        "shard 2's release never serves shard 1"
    );
    assert_eq!(w1.count.wakes(), 0);
}

#[test]
fn the_latest_waker_is_the_one_woken() {
    let h = handle(1);
    let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
    let mut a = Polled::new(&h, 1);
    assert!(a.poll().is_pending());
    let (other, other_count) = CountingWaker::new();
    assert!(poll_once(&mut a.fut, &other).is_pending());
    let _ = first.complete();
    assert_eq!((a.count.wakes(), other_count.wakes()), (0, 1));
    assert!(poll_once(&mut a.fut, &other).is_ready());
    assert!(
        poll_once(&mut a.fut, &other).is_pending(),
        "done: stays pending"
    );
}

#[test]
fn idle_handle_keeps_no_waiter_state() {
    let h = handle(1);
    let first = h.try_acquire(1).unwrap_or_else(|e| panic!("{e}"));
    let mut ws: vec::Vec<Polled> = (0..100).map(|i| Polled::new(&h, i % 3)).collect();
    for w in &mut ws {
        let _ = w.poll();
    }
    drop(ws);
    drop(first);
    assert_eq!(h.waiting(&1), 0);
    assert_eq!(h.total(|st| st.waiters.len()), 0);
    assert_eq!(h.live_credits(), 0);
}

#[test]
fn closed_resolves_only_once_closed_and_the_last_permit_is_released() {
    let h = handle(2);
    let a = h.try_acquire(1).expect("free credit");
    let b = h.try_acquire_owned(2).expect("free credit");
    // A waiter holding a handed-over credit when the close comes: the close gives it back.
    let (w, wakes) = CountingWaker::new();
    let mut waiter = Box::pin(h.acquire(1));
    let other = h.try_acquire(1).expect("second credit of shard 1");
    assert!(poll_once(&mut waiter, &w).is_pending());
    drop(other); // handed to the waiter, not yet observed
    let mut closed = Box::pin(h.closed());
    assert!(
        poll_once(&mut closed, &w).is_pending(),
        "not closed yet: pending even with credits about to be released"
    );
    h.close();
    assert!(poll_once(&mut waiter, &w).is_ready(), "the waiter fails");
    assert!(
        poll_once(&mut closed, &w).is_pending(),
        "two permits still live"
    );
    let before = wakes.wakes();
    drop(a);
    assert!(
        poll_once(&mut closed, &w).is_pending(),
        "one permit still live"
    );
    assert_eq!(h.live_credits(), 1);
    let _ = b.complete();
    assert!(
        wakes.wakes() > before,
        "the last release wakes the closed() waiter"
    );
    assert!(poll_once(&mut closed, &w).is_ready());
    // Already drained: a new `closed()` is ready at once.
    assert!(poll_once(&mut Box::pin(h.closed()), &w).is_ready());
}

mod timeouts {
    use super::*;
    use crate::sync::test_support::TestRuntime;
    use core::time::Duration;

    fn boxed<F: Future>(f: F) -> Pin<Box<F>> {
        Box::pin(f)
    }

    #[test]
    fn a_waiter_still_in_line_at_its_deadline_leaves_it_and_times_out() {
        let (rt, h) = (TestRuntime::new(), handle(1));
        let held = h.try_acquire(3).unwrap();
        let (waker, _) = CountingWaker::new();
        let mut first = boxed(h.acquire_timeout(&rt, 3, Duration::from_millis(10)));
        let mut second = boxed(h.acquire(3));
        assert!(poll_once(&mut first, &waker).is_pending());
        assert!(poll_once(&mut second, &waker).is_pending());
        assert_eq!(h.waiting(&3), 2);
        rt.clock.advance(Duration::from_millis(9));
        assert!(poll_once(&mut first, &waker).is_pending(), "1 ms early");
        rt.clock.advance(Duration::from_millis(1));
        match poll_once(&mut first, &waker) {
            Poll::Ready(Err(AcquireError::TimedOut(TimedOut))) => {}
            other => panic!("expected a timeout, got {:?}", other.map(|r| r.is_ok())),
        }
        assert_eq!(h.waiting(&3), 1, "the timed-out waiter left the line");
        // The credit goes to the waiter behind it, not to the one that gave up.
        assert_eq!(held.complete(), Released::HandedOn);
        let permit = match poll_once(&mut second, &waker) {
            Poll::Ready(Ok(p)) => p,
            _ => panic!("the next waiter should hold the credit"),
        };
        drop(first);
        drop(permit);
        assert_eq!(h.available(&3), 1);
        assert_eq!(h.live_credits(), 0);
        assert_eq!(h.stats().refused_releases, 0);
    }

    #[test]
    fn a_credit_handed_over_before_the_deadline_is_observed_wins_over_the_timer() {
        let (rt, h) = (TestRuntime::new(), handle(1));
        let held = h.try_acquire(3).unwrap();
        let (waker, _) = CountingWaker::new();
        let mut waiter = boxed(h.acquire_timeout(&rt, 3, Duration::from_millis(10)));
        assert!(poll_once(&mut waiter, &waker).is_pending());
        // The grant and the timer both happen before the next poll.
        assert_eq!(held.complete(), Released::HandedOn);
        rt.clock.advance(Duration::from_millis(10));
        let permit = match poll_once(&mut waiter, &waker) {
            Poll::Ready(Ok(p)) => p,
            _ => panic!("the granted credit must be taken, not dropped with a timeout"),
        };
        assert_eq!(h.in_flight(&3), 1);
        drop(permit);
        assert_eq!(h.live_credits(), 0);
        assert_eq!(h.available(&3), 1);
    }

    #[test]
    fn expire_on_a_granted_waiter_returns_its_permit() {
        // The timer path itself (`expire`), with the grant already made: the permit, not a
        // timeout (a timeout here would strand or silently free the handed credit).
        let h = handle(1);
        let held = h.try_acquire(3).unwrap();
        let (waker, _) = CountingWaker::new();
        let mut waiter = h.acquire(3);
        assert!(poll_once(&mut waiter, &waker).is_pending());
        assert_eq!(held.complete(), Released::HandedOn);
        let Ok(permit) = waiter.expire() else {
            panic!("the handed credit must come back as the permit");
        };
        assert_eq!(h.in_flight(&3), 1);
        drop(waiter);
        assert_eq!(
            h.in_flight(&3),
            1,
            "dropping the resolved future releases nothing"
        );
        drop(permit);
        assert_eq!(h.live_credits(), 0);
    }

    #[test]
    fn a_zero_timeout_takes_a_free_credit_and_times_out_without_one() {
        let (rt, h) = (TestRuntime::new(), handle(1));
        let (waker, _) = CountingWaker::new();
        let mut free = boxed(h.acquire_timeout(&rt, 3, Duration::ZERO));
        let permit = match poll_once(&mut free, &waker) {
            Poll::Ready(Ok(p)) => p,
            _ => panic!("a free credit is taken even at a zero timeout"),
        };
        let mut none = boxed(h.acquire_timeout(&rt, 3, Duration::ZERO));
        assert!(matches!(
            poll_once(&mut none, &waker),
            Poll::Ready(Err(AcquireError::TimedOut(_)))
        ));
        assert_eq!(h.waiting(&3), 0);
        drop(permit);
        assert_eq!(h.available(&3), 1);
    }

    #[test]
    fn close_before_the_deadline_resolves_closed_and_a_huge_timeout_never_fires() {
        let (rt, h) = (TestRuntime::new(), handle(1));
        let held = h.try_acquire(3).unwrap();
        let (waker, _) = CountingWaker::new();
        let mut waiter = boxed(h.acquire_timeout(&rt, 3, Duration::MAX));
        assert!(poll_once(&mut waiter, &waker).is_pending());
        rt.clock.advance(Duration::from_secs(1_000_000));
        assert!(
            poll_once(&mut waiter, &waker).is_pending(),
            "Instant::MAX never fires"
        );
        h.close();
        assert!(matches!(
            poll_once(&mut waiter, &waker),
            Poll::Ready(Err(AcquireError::Closed))
        ));
        drop(held);
        assert_eq!(h.live_credits(), 0);
    }
}

/// Shards spread over every stripe, each permit naming its shard's stripe; a waiter on one
/// stripe is served by its own shard's release while another stripe's permits come and go;
/// `close` fails the waiters of every stripe and `closed()` waits for the permits of all.
#[test]
fn shards_spread_over_all_stripes_and_close_reaches_every_one() {
    let h = handle(1);
    let mut by_stripe: Vec<Vec<u32>> = vec![Vec::new(); STRIPES];
    let keys = 32 * STRIPES as u32;
    for k in 0..keys {
        by_stripe[h.stripe_of(&k)].push(k);
    }
    let sizes: Vec<_> = by_stripe.iter().map(Vec::len).collect();
    assert!(
        sizes.iter().all(|&n| n > 0 && n < 4 * 32),
        "every stripe takes a share, none four times its share: {sizes:?}"
    );
    let (a, b) = (by_stripe[0][0], by_stripe[1][0]);
    let pa = h.try_acquire(a).expect("free");
    let pb = h.try_acquire(b).expect("free");
    assert_eq!((pa.stripe(), pb.stripe()), (0, 1));
    let (waker, count) = CountingWaker::new();
    let mut wa = h.acquire(a);
    let mut wb = h.acquire(b);
    assert!(poll_once(&mut wa, &waker).is_pending());
    assert!(poll_once(&mut wb, &waker).is_pending());
    // Stripe 1's release serves stripe 1's waiter only.
    assert_eq!(pb.complete(), Released::HandedOn);
    assert_eq!(count.wakes(), 1);
    let Poll::Ready(Ok(qb)) = poll_once(&mut wb, &waker) else {
        panic!("b's waiter not served");
    };
    assert_eq!((h.waiting(&a), h.in_flight(&a), h.in_flight(&b)), (1, 1, 1));
    // Close fails the waiter on stripe 0; closed() waits for both stripes' permits.
    h.close();
    assert_eq!(count.wakes(), 2);
    assert!(matches!(
        poll_once(&mut wa, &waker),
        Poll::Ready(Err(Closed))
    ));
    assert_eq!(
        h.try_acquire(by_stripe[5][0]).unwrap_err(),
        TryAcquireError::Closed
    );
    let mut closed = Box::pin(h.closed());
    assert!(poll_once(&mut closed, &waker).is_pending());
    drop(pa);
    assert!(
        poll_once(&mut closed, &waker).is_pending(),
        "stripe 1 still holds one"
    );
    drop(qb);
    assert!(poll_once(&mut closed, &waker).is_ready());
    assert_eq!(h.live_credits(), 0);
}

/// A paged walk over shards on every stripe lists each exactly once, whatever the page size,
/// including pages that end exactly where a stripe does.
#[test]
fn a_snapshot_walk_lists_every_shard_of_every_stripe_exactly_once() {
    let h = handle(2);
    let permits: Vec<_> = (0..200u32)
        .map(|k| h.try_acquire(k).expect("free"))
        .collect();
    let per_stripe = (0..STRIPES)
        .map(|s| (0..200u32).filter(|k| h.stripe_of(k) == s).count())
        .collect::<Vec<_>>();
    let mut sizes: Vec<usize> = vec![1, 3, 7, 200, 500];
    sizes.extend(per_stripe.iter().copied().filter(|&n| n > 0).take(2));
    for max in sizes {
        let (mut seen, mut from, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = h.snapshot(from, max);
            assert!(page.items.len() <= max);
            pages += 1;
            seen.extend(page.items.iter().map(|s| (s.shard, s.in_flight)));
            match page.next {
                Some(next) => from = Some(next),
                None => break,
            }
            assert!(pages < 1_000, "the walk does not end");
        }
        seen.sort_unstable();
        let want: Vec<(u32, u32)> = (0..200).map(|k| (k, 1)).collect();
        assert_eq!(seen, want, "page size {max}");
    }
    drop(permits);
}

/// `close` gives back a credit handed to a waiter that has not polled, which records a
/// `Released` event; the sink that receives it reads another stripe of the handle. The sink
/// runs once every stripe's lock is released, so it neither deadlocks nor finds a lock held.
#[test]
fn a_sink_reading_another_stripe_during_close_finds_every_stripe_unlocked() {
    let h = handle(1);
    let on = |s: usize| (0..10_000u32).find(|k| h.stripe_of(k) == s).expect("a key");
    let (a, b) = (on(0), on(1));
    let seen = std::sync::Arc::new(StdMutex::new(Vec::new()));
    let (log, probe) = (std::sync::Arc::clone(&seen), h.clone());
    h.set_event_sink(move |e: &WindowEvent<u32>| {
        // Locks stripe 1 (and stripe 0 for `a`) from inside the sink.
        let read = (probe.available(&b), probe.in_flight(&a));
        log.lock().unwrap().push((e.clone(), read));
    });
    let held = h.try_acquire(a).expect("free");
    let (waker, _count) = CountingWaker::new();
    let mut waiter = h.acquire(a);
    assert!(poll_once(&mut waiter, &waker).is_pending());
    assert_eq!(held.complete(), Released::HandedOn);
    seen.lock().unwrap().clear();
    h.close();
    let got = seen.lock().unwrap().clone();
    assert!(
        matches!(
            &got[..],
            [(WindowEvent::Released { in_flight: 0, .. }, (1, 0))]
        ),
        "{got:?}"
    );
    assert!(matches!(
        poll_once(&mut waiter, &waker),
        Poll::Ready(Err(Closed))
    ));
    assert_eq!(h.live_credits(), 0);
}

/// A hasher whose clones hash differently gives each stripe's window hashes the handle's
/// stripe choice does not match; a paged walk must still list every shard exactly once and
/// end (a cursor that derived its stripe from the window's hash went back to an earlier
/// stripe and looped).
#[test]
fn a_snapshot_walk_ends_and_lists_each_shard_once_when_the_hasher_clones_drift() {
    let h: WindowHandle<u32, DriftingHasher> =
        match WindowHandle::with_hasher(WindowConfig::default(), DriftingHasher(3)) {
            Ok(h) => h,
            Err(e) => panic!("valid config refused: {e}"),
        };
    let permits: Vec<_> = (0..300u32)
        .map(|k| h.try_acquire(k).expect("free"))
        .collect();
    for max in [1, 2, 5, 64] {
        let (mut seen, mut from, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = h.snapshot(from, max);
            pages += 1;
            assert!(pages < 2_000, "page size {max}: the walk does not end");
            seen.extend(page.items.iter().map(|s| s.shard));
            match page.next {
                Some(next) => from = Some(next),
                None => break,
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..300).collect::<Vec<u32>>(), "page size {max}");
    }
    drop(permits);
}

#[test]
fn a_grown_limit_serves_waiters_in_line_order_and_a_shrink_retires_releases() {
    use core::num::NonZeroUsize;
    let h = handle(1);
    let seen = std::sync::Arc::new(StdMutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    h.set_event_sink(move |e: &WindowEvent<u32>| {
        if let WindowEvent::Dispatched { shard, .. } = e {
            log.lock().unwrap_or_else(|p| p.into_inner()).push(*shard);
        }
    });
    let first = h.try_acquire(5).expect("free");
    let mut line: Vec<_> = (0..3)
        .map(|_| {
            let (waker, wakes) = CountingWaker::new();
            let mut fut = h.acquire(5);
            assert!(poll_once(&mut fut, &waker).is_pending());
            (fut, waker, wakes)
        })
        .collect();
    // Grow to 3: two credits free, for the two oldest waiters, each woken once.
    assert_eq!(h.set_max_in_flight(&5, NonZeroUsize::new(3)), 2);
    let wakes: Vec<usize> = line.iter().map(|(_, _, w)| w.wakes()).collect();
    assert_eq!(wakes, [1, 1, 0]);
    assert_eq!((h.in_flight(&5), h.waiting(&5), h.available(&5)), (3, 1, 0));
    assert_eq!(
        seen.lock().unwrap_or_else(|p| p.into_inner()).len(),
        3,
        "one Dispatched per credit issued, the two granted ones included"
    );
    let mut permits = Vec::new();
    for (fut, waker, _) in line.iter_mut().take(2) {
        let Poll::Ready(Ok(p)) = poll_once(fut, waker) else {
            panic!("a granted waiter was not served");
        };
        permits.push(p);
    }
    // Shrink to 1 with three held and one waiting: nothing is revoked; the next two releases
    // retire their credits, and the third hands its credit to the last waiter.
    assert_eq!(h.set_max_in_flight(&5, NonZeroUsize::new(1)), 0);
    assert_eq!(h.in_flight(&5), 3);
    assert_eq!(first.complete(), Released::Freed);
    assert_eq!(permits.remove(0).complete(), Released::Freed);
    assert_eq!(line[2].2.wakes(), 0, "woken above the limit");
    assert_eq!(permits.remove(0).complete(), Released::HandedOn);
    let (fut, waker, wakes) = &mut line[2];
    assert_eq!(wakes.wakes(), 1);
    let Poll::Ready(Ok(last)) = poll_once(fut, waker) else {
        panic!("the last waiter was not served");
    };
    assert_eq!((h.in_flight(&5), h.available(&5)), (1, 0));
    drop(last);
    // Back to the configured limit: the shard's entry may go again.
    assert_eq!(h.set_max_in_flight(&5, None), 0);
    assert_eq!((h.capacity_of(&5), h.available(&5)), (1, 1));
    assert_eq!(h.stats().refused_releases, 0);
    assert_eq!(h.live_credits(), 0);
}

#[test]
fn a_limit_change_after_close_does_nothing() {
    let h = handle(1);
    h.close();
    assert_eq!(h.set_max_in_flight(&5, core::num::NonZeroUsize::new(4)), 0);
    assert_eq!(h.capacity_of(&5), 1);
}
