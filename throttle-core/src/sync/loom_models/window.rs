//! The window handle: permits, waiters, close, and two shards under the one lock.

use core::hash::{BuildHasher, Hasher};
use core::num::NonZeroUsize;
use core::task::Poll;

use loom::thread;

use super::support::{in_line, ready_at_once, served_now_or_after_one_wake, woken_once_and_served};
use super::{Hand, boxed, join};
use crate::dispatch_window::WindowConfig;
use crate::sync::test_support::TestRuntime;
use crate::sync::test_support::{CountingWaker, poll_once};
use crate::sync::{AcquireError, Closed, OwnedPermit, Released, TryAcquireError, WindowHandle};
use crate::test_hasher::TestHasher;

type Handle<S = TestHasher> = WindowHandle<u32, S>;

fn window<S: BuildHasher + Clone + Default>(cap: u32) -> Handle<S> {
    match Handle::with_hasher(
        WindowConfig::default().with_max_in_flight(cap as usize),
        S::default(),
    ) {
        Ok(h) => h,
        Err(e) => panic!("valid config refused: {e}"),
    }
}

fn permit<S>(h: &Handle<S>, shard: u32) -> OwnedPermit<u32, S>
where
    S: BuildHasher + 'static,
{
    match h.try_acquire_owned(shard) {
        Ok(p) => p,
        Err(e) => panic!("expected free credit: {e}"),
    }
}

/// A window of capacity 1 whose one credit, on shard 0, is held: an acquire of shard 0 waits.
fn full() -> (Handle, OwnedPermit<u32, TestHasher>) {
    let h = window::<TestHasher>(1);
    let p = permit(&h, 0);
    (h, p)
}

/// The end state every window model reaches once its permits are gone: no credit live, the
/// shard's credits all available again (its own capacity, if a limit was set), none released
/// twice, never more than the largest capacity in flight, and `closed()` ready if the handle
/// was closed.
fn assert_settled<S: BuildHasher>(h: &Handle<S>, shards: &[u32]) {
    let stats = h.stats();
    assert_eq!(stats.refused_releases, 0, "a credit was released twice");
    let most = shards
        .iter()
        .map(|s| h.capacity_of(s))
        .fold(h.capacity(), u32::max);
    assert!(
        stats.peak_in_flight <= most,
        "over capacity: {} in flight",
        stats.peak_in_flight
    );
    assert_eq!(h.live_credits(), 0, "a credit was lost");
    for shard in shards {
        assert_eq!(h.in_flight(shard), 0, "shard {shard} still counts a credit");
        assert_eq!(
            h.available(shard),
            h.capacity_of(shard),
            "shard {shard} lost credit"
        );
        assert_eq!(h.waiting(shard), 0, "shard {shard} still has a line");
    }
    if h.is_closed() {
        assert!(
            ready_at_once(h.closed()),
            "closed() pending with nothing live"
        );
    }
}

/// Completion, drop and close race on the permits of one shard while a waiter waits: every
/// credit is released exactly once (the window refuses none), the shard never exceeds its
/// capacity, and the waiter resolves (a permit or `Closed`) after being woken.
#[test]
fn permit_complete_drop_and_close_release_every_credit_once() {
    super::model(|| {
        let h = window::<TestHasher>(2);
        let (p1, p2) = (permit(&h, 0), permit(&h, 0));
        let [mut waiter] = in_line(|| h.acquire_owned(0));

        let t1 = thread::spawn(move || {
            let _ = p1.complete();
        });
        let t2 = thread::spawn(move || drop(p2));
        let early = waiter.poll();
        h.close();
        join(t1);
        join(t2);

        let outcome = match early {
            Poll::Pending => waiter.poll(),
            ready => ready,
        };
        match outcome {
            Poll::Ready(Ok(p)) => drop(p),
            Poll::Ready(Err(Closed)) => {}
            Poll::Pending => panic!("waiter left pending after close"),
        }
        assert!(waiter.wakes() >= 1, "the waiter was woken");
        assert_settled(&h, &[0]);
    });
}

/// A waiter is cancelled while the release hands it the credit: the credit reaches the next
/// waiter, exactly once.
#[test]
fn cancelled_waiter_racing_the_handoff_passes_the_credit_on() {
    super::model(|| {
        let (h, p) = full();
        let [a, mut b] = in_line(|| h.acquire_owned(0));

        let t1 = thread::spawn(move || {
            let _ = p.complete();
        });
        let t2 = thread::spawn(move || drop(a.fut));
        join(t1);
        join(t2);

        let pb = woken_once_and_served(&mut b, "b", "credit");
        assert_eq!(h.in_flight(&0), 1);
        assert_eq!(h.stats().peak_in_flight, 1, "the credit was duplicated");
        assert_eq!(pb.complete(), Released::Freed);
        assert_settled(&h, &[0]);
    });
}

/// A release races the first poll of a new acquire: whichever wins, the acquirer ends with the
/// credit (at once, or woken by the hand-off): no lost wake-up.
#[test]
fn release_racing_a_first_poll_loses_no_wakeup() {
    super::model(|| {
        let (h, p) = full();
        let t1 = thread::spawn(move || {
            let _ = p.complete();
        });
        let (waker, wakes) = CountingWaker::new();
        let mut w = h.acquire_owned(0);
        let first = poll_once(&mut w, &waker);
        join(t1);
        let permit = served_now_or_after_one_wake(
            first,
            &mut w,
            (&waker, &wakes),
            "lost wake-up",
            "woken but no credit",
        );
        drop(permit);
        assert_settled(&h, &[0]);
    });
}

/// A release races a newcomer while an older waiter waits: the older waiter gets the credit,
/// the newcomer waits behind it (FIFO), and is served by the next release.
#[test]
fn release_racing_a_newcomer_serves_the_older_waiter_first() {
    super::model(|| {
        let (h, p) = full();
        let [mut a] = in_line(|| h.acquire_owned(0));
        let t1 = thread::spawn(move || {
            let _ = p.complete();
        });
        let (wb, b_wakes) = CountingWaker::new();
        let mut b = h.acquire_owned(0);
        let b_first = poll_once(&mut b, &wb);
        join(t1);

        assert!(b_first.is_pending(), "the newcomer barged past the waiter");
        assert_eq!(a.wakes(), 1, "the older waiter was not woken");
        let Poll::Ready(Ok(pa)) = a.poll() else {
            panic!("the older waiter was not served");
        };
        assert!(poll_once(&mut b, &wb).is_pending());
        assert_eq!(pa.complete(), Released::HandedOn);
        assert_eq!(b_wakes.wakes(), 1, "the newcomer was not woken");
        assert!(matches!(poll_once(&mut b, &wb), Poll::Ready(Ok(_))));
        assert_settled(&h, &[0]);
    });
}

/// A `closed()` waiter on its own clone of `h`, polled once (pending: `h` is open), with the
/// waker it was polled with and that waker's count.
fn closed_listener(
    h: &Handle,
) -> (
    core::pin::Pin<alloc::boxed::Box<impl core::future::Future<Output = ()>>>,
    core::task::Waker,
    crate::sync::test_support::WakeCount,
) {
    let (waker, wakes) = CountingWaker::new();
    let mut closed = boxed({
        let h = h.clone();
        async move { h.closed().await }
    });
    assert!(poll_once(&mut closed, &waker).is_pending());
    (closed, waker, wakes)
}

/// `close` on one thread races the last permit's release on another while a `closed()`
/// waiter polls (and a second `closed()` is first polled): neither resolves before both have
/// happened, and once both have the waiter is woken (or was ready already), so a graceful
/// shutdown neither ends early nor hangs.
#[test]
fn window_closed_resolves_after_close_and_the_last_release_and_not_before() {
    super::model(|| {
        let (h, p) = full();
        let (mut closed, waker, wakes) = closed_listener(&h);

        let h1 = h.clone();
        let t1 = thread::spawn(move || h1.close());
        let t2 = thread::spawn(move || {
            let _ = p.complete();
        });
        let early = poll_once(&mut closed, &waker);
        // A `closed()` first polled now reads the state itself.
        let fresh = Hand::new(boxed(h.closed())).poll();
        if early.is_ready() || fresh.is_ready() {
            assert!(
                h.is_closed() && h.live_credits() == 0,
                "closed() resolved before the close and the last release"
            );
        }
        join(t1);
        join(t2);

        if early.is_pending() {
            assert!(
                wakes.wakes() >= 1,
                "lost wake-up: the waiter was never woken"
            );
            assert!(poll_once(&mut closed, &waker).is_ready());
        }
        assert_settled(&h, &[0]);
    });
}

/// `close` races a waiter's cancellation while a release may hand that waiter the credit
/// (`close` ∥ a cancelled wait ∥ the hand-off, three threads): the credit is given back once,
/// by whichever of the close and the cancelled future saw it last, never by both; the other
/// waiter is woken and resolves to `Closed`; `closed()` resolves.
#[test]
fn window_close_racing_a_cancelled_wait_releases_its_credit_once() {
    super::model(|| {
        let (h, p) = full();
        let [a, mut b] = in_line(|| h.acquire_owned(0));

        let h1 = h.clone();
        let t1 = thread::spawn(move || h1.close());
        let t2 = thread::spawn(move || drop(a.fut));
        let _ = p.complete();
        join(t1);
        join(t2);

        assert!(b.wakes() >= 1, "b left unwoken");
        assert!(
            matches!(b.poll(), Poll::Ready(Err(Closed))),
            "b must resolve to Closed: nothing is handed out after close"
        );
        assert_settled(&h, &[0]);
    });
}

/// `try_acquire` on one thread races a release on another. With a waiter in line
/// (`queued`), the freed credit is the waiter's: `try_acquire` is refused whatever the order,
/// and the waiter is woken and served. With nobody waiting, it gets the credit only after the
/// release, never beside the held one; if it lost the race the credit is free afterwards.
#[test]
fn try_acquire_racing_a_release_never_barges_nor_exceeds_the_capacity() {
    for queued in [true, false] {
        super::model(move || {
            let (h, p) = full();
            let mut a = Hand::new(h.acquire_owned(0));
            if queued {
                assert!(a.poll().is_pending());
            }
            let h2 = h.clone();
            let t1 = thread::spawn(move || p.complete());
            let t2 = thread::spawn(move || h2.try_acquire_owned(0));
            let released = join(t1);
            let tried = join(t2);

            if queued {
                assert_eq!(released, Released::HandedOn);
                assert!(
                    matches!(tried, Err(TryAcquireError::NoCredit)),
                    "try_acquire barged past a waiter"
                );
                assert_eq!(a.wakes(), 1, "the waiter was not woken");
            }
            match tried {
                Ok(p) => {
                    assert_eq!(h.in_flight(&0), 1);
                    drop(p);
                }
                Err(TryAcquireError::NoCredit) if !queued => {
                    assert_eq!(h.available(&0), 1, "the released credit is not free");
                }
                Err(TryAcquireError::NoCredit) => {}
                Err(e) => panic!("{e}"),
            }
            match a.poll() {
                Poll::Ready(Ok(p)) => drop(p),
                other => panic!("the waiter was not served: {:?}", other.map(|r| r.is_ok())),
            }
            assert_settled(&h, &[0]);
        });
    }
}

/// Two waiters cancelled on two threads race the release that would hand one of them the
/// credit: the credit skips both (a cancelled waiter's grant is passed on) and reaches the
/// third waiter, woken exactly once.
#[test]
fn two_cancellations_racing_one_release_hand_the_credit_to_the_third_waiter() {
    super::model(|| {
        let (h, p) = full();
        let [a, b, mut c] = in_line(|| h.acquire_owned(0));

        let t1 = thread::spawn(move || drop(a.fut));
        let t2 = thread::spawn(move || drop(b.fut));
        let _ = p.complete();
        join(t1);
        join(t2);

        let pc = woken_once_and_served(&mut c, "c", "credit");
        assert_eq!((h.in_flight(&0), h.live_credits()), (1, 1));
        drop(pc);
        assert_settled(&h, &[0]);
    });
}

/// A waiter re-polled from another task (a new waker) races the release that hands it the
/// credit: it is ready at once, or its new waker is woken (never only the old one).
#[test]
fn waker_replaced_racing_a_handoff_wakes_the_new_waker() {
    super::model(|| {
        let (h, p) = full();
        let (new, new_wakes) = CountingWaker::new();
        // First polled with its own waker (the old one).
        let [mut a] = in_line(|| h.acquire_owned(0));

        let t1 = thread::spawn(move || p.complete());
        let moved = poll_once(&mut a.fut, &new);
        assert_eq!(join(t1), Released::HandedOn);

        let pa = served_now_or_after_one_wake(
            moved,
            &mut a.fut,
            (&new, &new_wakes),
            "lost wake-up: only the old waker was woken",
            "woken but no credit",
        );
        drop(pa);
        assert_settled(&h, &[0]);
    });
}

/// A hasher that sends every key to one bucket: shards are told apart only by the entry id
/// their credits and tickets remember.
#[derive(Clone, Copy, Default)]
struct Colliding;

struct Constant;

impl Hasher for Constant {
    fn finish(&self) -> u64 {
        7
    }
    fn write(&mut self, _: &[u8]) {}
}

impl BuildHasher for Colliding {
    type Hasher = Constant;
    fn build_hasher(&self) -> Constant {
        Constant
    }
}

/// Two shards share the handle's one lock: releases of shard 0 and shard 1 on two threads,
/// each with a waiter: each credit goes to its own shard's waiter, each waiter is woken once,
/// neither shard exceeds its capacity, and the counts come back to zero. Run with a plain
/// hasher and with one under which the two shards collide.
fn two_shards_under_one_lock<S>()
where
    S: BuildHasher + Clone + Default + Send + Sync + 'static,
{
    super::model(|| {
        let h = window::<S>(1);
        let (p0, p1) = (permit(&h, 0), permit(&h, 1));
        let mut a0 = Hand::new(h.acquire_owned(0));
        let mut a1 = Hand::new(h.acquire_owned(1));
        assert!(a0.poll().is_pending());
        assert!(a1.poll().is_pending());

        let t1 = thread::spawn(move || p0.complete());
        let t2 = thread::spawn(move || p1.complete());
        assert_eq!(
            join(t1),
            Released::HandedOn,
            "shard 0's waiter not handed on"
        );
        assert_eq!(
            join(t2),
            Released::HandedOn,
            "shard 1's waiter not handed on"
        );

        assert_eq!((a0.wakes(), a1.wakes()), (1, 1), "each waiter woken once");
        let (Poll::Ready(Ok(q0)), Poll::Ready(Ok(q1))) = (a0.poll(), a1.poll()) else {
            panic!("a shard's waiter was not served");
        };
        assert_eq!(
            (*q0.shard(), *q1.shard()),
            (0, 1),
            "a credit crossed shards"
        );
        assert_eq!(
            (h.in_flight(&0), h.in_flight(&1), h.live_credits()),
            (1, 1, 2)
        );
        drop((q0, q1));
        assert_settled(&h, &[0, 1]);
    });
}

#[test]
fn two_shards_under_one_lock_each_serve_their_own_waiter() {
    two_shards_under_one_lock::<TestHasher>();
    two_shards_under_one_lock::<Colliding>();
}

/// The timer of a timed acquire fires while a release hands the waiter the credit (and, in
/// the second variant, while the handle closes): the waiter ends with the permit (the grant
/// won) or with a timeout / `Closed`, and in the latter case the credit is free again, never
/// stranded with a waiter that gave up and never issued twice.
#[test]
fn a_timed_out_acquire_racing_the_handoff_loses_no_credit() {
    for close in [false, true] {
        super::model(move || {
            let rt = TestRuntime::new();
            let (h, p) = full();
            let deadline = crate::time::Instant::from_millis(10);
            let mut waiter = boxed(h.acquire_owned(0).deadline(&rt, deadline));
            let (waker, _) = CountingWaker::new();
            assert!(poll_once(&mut waiter, &waker).is_pending());

            let closer = h.clone();
            let t1 = thread::spawn(move || {
                let _ = p.complete();
                if close {
                    closer.close();
                }
            });
            let t2 = thread::spawn(move || {
                rt.clock.advance(core::time::Duration::from_millis(10));
                match poll_once(&mut waiter, &waker) {
                    Poll::Ready(outcome) => outcome,
                    Poll::Pending => panic!("the deadline passed: the wait must end"),
                }
            });
            join(t1);
            match join(t2) {
                Ok(permit) => {
                    assert_eq!(h.in_flight(&0), 1, "the grant is the permit's");
                    drop(permit);
                }
                Err(AcquireError::TimedOut(_)) | Err(AcquireError::Closed) => {
                    assert_eq!(h.in_flight(&0), 0, "a waiter that gave up holds no credit");
                }
            }
            assert_settled(&h, &[0]);
        });
    }
}

/// Two shards of one handle, one on each of loom's two stripes.
fn keys_on_two_stripes<S: BuildHasher>(h: &Handle<S>) -> (u32, u32) {
    let on = |s: usize| (0..1_000u32).find(|k| h.stripe_of(k) == s);
    match (on(0), on(1)) {
        (Some(a), Some(b)) => (a, b),
        _ => panic!("no key on one of the two stripes"),
    }
}

/// `close` races a release on each of two stripes, each stripe with a waiter in line, while
/// a `closed()` waiter polls: on each stripe the waiter resolves to the permit handed to it or
/// to `Closed`, never both and never neither; no credit is released twice or stranded on
/// either stripe; once `close` has returned neither stripe issues a credit; `closed()`
/// resolves only when both stripes are drained, and is woken for it.
#[test]
fn close_racing_releases_on_two_stripes_settles_both() {
    super::model(|| {
        let h = window::<TestHasher>(1);
        let (a, b) = keys_on_two_stripes(&h);
        let (pa, pb) = (permit(&h, a), permit(&h, b));
        assert_ne!(pa.stripe(), pb.stripe());
        let mut wa = Hand::new(h.acquire_owned(a));
        let mut wb = Hand::new(h.acquire_owned(b));
        assert!(wa.poll().is_pending() && wb.poll().is_pending());
        let (mut closed, waker, wakes) = closed_listener(&h);

        let h1 = h.clone();
        let t1 = thread::spawn(move || {
            h1.close();
            // Nothing is issued on any stripe once close returned.
            assert_eq!(h1.try_acquire(a).err(), Some(TryAcquireError::Closed));
            assert_eq!(h1.try_acquire(b).err(), Some(TryAcquireError::Closed));
        });
        let t2 = thread::spawn(move || pa.complete());
        let _ = pb.complete();
        join(t1);
        let _ = join(t2);

        for (name, w) in [("a", &mut wa), ("b", &mut wb)] {
            assert!(w.wakes() >= 1, "{name}'s waiter left unwoken");
            match w.poll() {
                Poll::Ready(Ok(p)) => drop(p),
                Poll::Ready(Err(Closed)) => {}
                Poll::Pending => panic!("{name}'s waiter never resolved"),
            }
        }
        let early = poll_once(&mut closed, &waker);
        if early.is_pending() {
            assert!(wakes.wakes() >= 1, "closed() lost its wake-up");
            assert!(poll_once(&mut closed, &waker).is_ready());
        }
        assert_settled(&h, &[a, b]);
    });
}

/// Releases on two stripes run on two threads, each handing its credit to its own waiter:
/// neither lock waits for the other (each release changes only its stripe), each waiter is
/// woken once and served its own shard's credit.
#[test]
fn releases_on_two_stripes_each_serve_their_own_line() {
    super::model(|| {
        let h = window::<TestHasher>(1);
        let (a, b) = keys_on_two_stripes(&h);
        let (pa, pb) = (permit(&h, a), permit(&h, b));
        let mut wa = Hand::new(h.acquire_owned(a));
        let mut wb = Hand::new(h.acquire_owned(b));
        assert!(wa.poll().is_pending() && wb.poll().is_pending());
        let t1 = thread::spawn(move || pa.complete());
        let t2 = thread::spawn(move || pb.complete());
        assert_eq!(
            (join(t1), join(t2)),
            (Released::HandedOn, Released::HandedOn)
        );
        assert_eq!((wa.wakes(), wb.wakes()), (1, 1));
        let (Poll::Ready(Ok(qa)), Poll::Ready(Ok(qb))) = (wa.poll(), wb.poll()) else {
            panic!("a stripe's waiter was not served");
        };
        assert_eq!((*qa.shard(), *qb.shard()), (a, b));
        assert_ne!(qa.stripe(), qb.stripe());
        drop((qa, qb));
        assert_settled(&h, &[a, b]);
    });
}

/// `close` races the first use of a stripe (its window made under its lock, with the owner
/// count of an owned permit made beside it), and a second owned acquire of the same new
/// stripe: each acquire either gets a credit that `close` then leaves valid, or finds the
/// handle closed, never a credit issued after `close` returned; the stripe's window is made
/// once; `closed()` resolves only after the permits are released.
#[test]
fn close_racing_the_first_use_of_a_stripe() {
    super::model(|| {
        let h = window::<TestHasher>(2);
        let (a, b) = keys_on_two_stripes(&h);
        let pa = permit(&h, a); // stripe 1 is not used yet
        let (mut closed, waker, wakes) = closed_listener(&h);

        let h1 = h.clone();
        let t1 = thread::spawn(move || {
            h1.close();
            assert_eq!(h1.try_acquire(b).err(), Some(TryAcquireError::Closed));
        });
        let h2 = h.clone();
        let t2 = thread::spawn(move || h2.try_acquire_owned(b).map(|p| p.complete()));
        let mine = h.try_acquire_owned(b);
        join(t1);
        let theirs = join(t2);
        assert!(matches!(theirs, Ok(_) | Err(TryAcquireError::Closed)));
        assert!(matches!(mine, Ok(_) | Err(TryAcquireError::Closed)));
        assert!(
            poll_once(&mut closed, &waker).is_pending(),
            "a's permit is held"
        );
        drop(pa);
        if let Ok(p) = mine {
            assert_eq!(h.in_flight(&b), 1);
            assert!(
                poll_once(&mut closed, &waker).is_pending(),
                "b's permit is held"
            );
            drop(p);
        }
        assert!(wakes.wakes() >= 1, "closed() lost its wake-up");
        assert!(poll_once(&mut closed, &waker).is_ready());
        assert_settled(&h, &[a, b]);
    });
}

/// Sets shard 0's limit to `n` on a thread of its own; joins to the waiters it granted.
fn limit_on_a_thread(h: &Handle, n: usize) -> thread::JoinHandle<usize> {
    let h = h.clone();
    thread::spawn(move || h.set_max_in_flight(&0, NonZeroUsize::new(n)))
}

/// A limit that grows (1 to 2) races a release while two waiters wait: whichever runs first,
/// each of the two freed credits reaches one waiter, in line order, exactly once (the release
/// hands its credit to the oldest waiter; the grown limit hands the new one to the oldest still
/// waiting), each waiter is woken once, and never more than the new limit is in flight.
#[test]
fn a_grown_limit_racing_a_release_serves_both_waiters_once() {
    super::model(|| {
        let (h, p) = full();
        let [mut a, mut b] = in_line(|| h.acquire_owned(0));
        let t1 = limit_on_a_thread(&h, 2);
        let t2 = thread::spawn(move || p.complete());
        let granted = join(t1);
        let released = join(t2);
        // The grow found the release's freed slot or not: the two hand two credits in all.
        let handed = granted + usize::from(released == Released::HandedOn);
        assert_eq!(
            handed, 2,
            "the grow granted {granted}, the release {released:?}"
        );
        let pa = woken_once_and_served(&mut a, "a", "credit");
        let pb = woken_once_and_served(&mut b, "b", "credit");
        assert_eq!((h.in_flight(&0), h.capacity_of(&0)), (2, 2));
        drop((pa, pb));
        assert_settled(&h, &[0]);
    });
}

/// A limit that shrinks (2 to 1) races a release while a waiter waits: if the release runs
/// first it hands its credit to the waiter (two held, above the new limit: nothing revoked);
/// if the shrink runs first the release retires its credit (one held, at the limit) and the
/// waiter still waits. Either way the last permit's release serves the waiter (or frees),
/// no credit is lost or duplicated, and once settled the shard has the new limit free.
#[test]
fn a_shrunk_limit_racing_a_release_retires_or_hands_on_and_never_revokes() {
    super::model(|| {
        let h = window::<TestHasher>(2);
        let (p1, p2) = (permit(&h, 0), permit(&h, 0));
        let [mut a] = in_line(|| h.acquire_owned(0));
        let t1 = limit_on_a_thread(&h, 1);
        let t2 = thread::spawn(move || p1.complete());
        assert_eq!(join(t1), 0, "a shrink grants nothing");
        let released = join(t2);
        let pa = match released {
            Released::HandedOn => {
                assert_eq!((h.in_flight(&0), h.available(&0)), (2, 0));
                let pa = woken_once_and_served(&mut a, "a", "credit");
                assert_eq!(p2.complete(), Released::Freed, "one held: at the limit");
                pa
            }
            Released::Freed => {
                assert_eq!((h.in_flight(&0), h.waiting(&0)), (1, 1), "retired");
                assert_eq!(a.wakes(), 0, "woken with no credit");
                assert_eq!(p2.complete(), Released::HandedOn);
                woken_once_and_served(&mut a, "a", "credit")
            }
        };
        assert_eq!(h.in_flight(&0), 1);
        drop(pa);
        assert_eq!(h.capacity_of(&0), 1);
        assert_settled(&h, &[0]);
    });
}

/// A grown limit races a newcomer's first poll: the newcomer is served at once (it saw the
/// free credit) or joins the line and the grow hands it the credit and wakes it: no lost
/// wake-up, no credit issued twice.
#[test]
fn a_grown_limit_racing_a_first_poll_loses_no_wakeup() {
    super::model(|| {
        let (h, p) = full();
        let t1 = limit_on_a_thread(&h, 2);
        let (waker, wakes) = CountingWaker::new();
        let mut w = h.acquire_owned(0);
        let first = poll_once(&mut w, &waker);
        let granted = join(t1);
        assert_eq!(
            granted,
            usize::from(first.is_pending()),
            "granted to nobody waiting"
        );
        let permit = served_now_or_after_one_wake(
            first,
            &mut w,
            (&waker, &wakes),
            "lost wake-up",
            "woken but no credit",
        );
        assert_eq!(h.in_flight(&0), 2);
        drop((p, permit));
        assert_settled(&h, &[0]);
    });
}
