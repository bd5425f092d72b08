//! Unit tests of the single-shard window (the model checker runs it against the reference).

use super::*;
use crate::dispatch_window::{DispatchWindow, MAINTENANCE_INTERVAL};
use crate::test_hasher::TestHasher;
use alloc::vec;

fn window(n: usize) -> SingleWindow<&'static str> {
    SingleWindow::limited(NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN))
}

fn sent(r: Result<Option<Dispatch<(), &'static str>>, SubmitError<&'static str>>) -> CreditId {
    match r {
        Ok(Some(d)) => d.credit,
        other => panic!("expected a dispatch, got {other:?}"),
    }
}

#[test]
fn credits_queue_park_and_reclaim_follow_the_shard_rules() {
    let mut w = window(2);
    let a = sent(w.submit("a"));
    let b = sent(w.submit("b"));
    assert_eq!((w.in_flight(), w.available()), (2, 0));
    assert_eq!(w.submit("q1"), Ok(None));
    assert_eq!(w.submit_or_park("open"), Ok(None));
    assert_eq!(
        w.submit_or_park("open2"),
        Err(SubmitError::AlreadyParked("open2"))
    );
    assert_eq!(w.submit("q2"), Ok(None));
    assert_eq!((w.queued(), w.parked()), (2, Some(&"open")));
    // Queued first, in order, then the parked one.
    let next = w.complete(a).ok().flatten().map(|d| d.batch);
    assert_eq!(next, Some("q1"));
    assert_eq!(w.reclaim(), Some("open"));
    assert_eq!(w.reclaim(), None);
    let q2 = w.complete(b).ok().flatten();
    assert_eq!(q2.as_ref().map(|d| d.batch), Some("q2"));
    assert_eq!(w.in_flight() + w.available(), w.capacity());
    // A second release, a forged id and another window's id change nothing.
    assert_eq!(w.complete(b), Err(ReleaseError::AlreadyReleased));
    let other = sent(window(1).submit("x"));
    assert_eq!(w.complete(other), Err(ReleaseError::Unknown));
    assert_eq!(
        w.complete(CreditId::forge(w.instance_tag(), 7, 99)),
        Err(ReleaseError::Unknown)
    );
    assert_eq!((w.in_flight(), w.live_credits()), (2, 2));
}

#[test]
fn a_cancelled_batch_leaves_the_line_in_o1_and_its_ticket_is_spent() {
    let mut w = window(1);
    let a = sent(w.submit("a"));
    let tickets: Vec<Ticket> = ["b", "c", "d"]
        .into_iter()
        .map(|b| match w.enqueue(b) {
            Ok(Submitted::Queued(t)) => t,
            other => panic!("expected to queue, got {other:?}"),
        })
        .collect();
    assert_eq!(w.cancel(tickets[1]), Ok("c"));
    assert_eq!(w.cancel(tickets[1]), Err(ReleaseError::AlreadyReleased));
    assert!(!w.is_queued(tickets[1]) && w.is_queued(tickets[0]));
    let mut other = window(1);
    let _ = sent(other.submit("x"));
    let Ok(Submitted::Queued(foreign)) = other.enqueue("y") else {
        panic!("no credit: queued");
    };
    assert_eq!(w.cancel(foreign), Err(ReleaseError::Unknown));
    let mut order = vec![];
    let mut credit = a;
    while let Ok(Some(d)) = w.complete(credit) {
        order.push(d.batch);
        credit = d.credit;
    }
    assert_eq!(order, ["b", "d"]);
    assert!(w.is_idle());
}

#[test]
fn close_fails_held_work_and_drain_sends_it() {
    let mut w = window(1);
    let a = sent(w.submit("a"));
    assert_eq!(w.submit("q"), Ok(None));
    assert_eq!(w.submit_or_park("open"), Ok(None));
    let mut d = w.clone();
    assert_eq!(w.close(), ["q", "open"]);
    assert_eq!(w.submit("late"), Err(SubmitError::Closed("late")));
    assert_eq!(w.complete(a), Ok(None));
    assert!(w.is_drained() && w.close().is_empty());

    d.drain();
    assert!(d.is_draining() && d.is_closed() && !d.is_drained());
    assert_eq!(d.submit_or_park("late"), Err(SubmitError::Closed("late")));
    let q = d.complete(a).ok().flatten().map(|x| (x.batch, x.credit));
    let Some(("q", q)) = q else {
        panic!("the queued batch leaves first, got {q:?}");
    };
    let open = d.complete(q).ok().flatten().map(|x| (x.batch, x.credit));
    let Some(("open", open)) = open else {
        panic!("then the parked one, got {open:?}");
    };
    assert!(!d.is_drained());
    assert_eq!(d.complete(open), Ok(None));
    assert!(d.is_drained() && d.is_idle());
}

#[test]
fn the_single_window_answers_as_one_shard_of_the_multi_window() {
    // The same inputs on both types give the same outcomes (credits aside: each window
    // issues its own ids).
    let mut s = window(2);
    let mut m: DispatchWindow<u8, &str, TestHasher> = DispatchWindow::limited(
        NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
        TestHasher::default(),
    );
    let mut live = vec![];
    for (i, b) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
        let (x, y) = if i == 3 {
            (s.submit_or_park(b), m.submit_or_park(0, b))
        } else {
            (s.submit(b), m.submit(0, b))
        };
        assert_eq!(
            x.as_ref().ok().map(Option::is_some),
            y.as_ref().ok().map(Option::is_some)
        );
        if let (Ok(Some(x)), Ok(Some(y))) = (x, y) {
            live.push((x.credit, y.credit));
        }
    }
    s.drain();
    m.drain();
    while let Some((cs, cm)) = live.pop() {
        let (x, y) = (s.complete(cs), m.complete(cm));
        assert_eq!(
            x.as_ref().ok().map(|d| d.as_ref().map(|d| d.batch)),
            y.as_ref().ok().map(|d| d.as_ref().map(|d| d.batch))
        );
        if let (Ok(Some(x)), Ok(Some(y))) = (x, y) {
            live.push((x.credit, y.credit));
        }
        assert_eq!(
            (s.in_flight(), s.queued(), s.is_parked()),
            (m.in_flight(&0), m.queued(&0), m.is_parked(&0))
        );
    }
    assert!(s.is_drained() && m.is_drained());
}

#[test]
fn ids_never_wrap_and_maintenance_gives_memory_back() {
    let mut w = window(1);
    w.skip_generations_to(u64::MAX - 1);
    let a = sent(w.submit("a"));
    assert_eq!(w.submit("q"), Ok(None));
    // No credit id left for "q": it stays held (a newcomer queues behind it), and close
    // collects both.
    assert_eq!(w.complete(a), Ok(None));
    assert!(w.is_exhausted() && w.queued() == 1 && w.shard_count() == 1);
    assert_eq!(w.submit("b"), Ok(None));
    assert_eq!(w.close(), ["q", "b"]);
    assert_eq!(w.shard_count(), 0);

    let mut w = window(1);
    let a = sent(w.submit("a"));
    for _ in 0..100 {
        assert_eq!(w.submit("q"), Ok(None));
    }
    let mut credit = a;
    while let Ok(Some(d)) = w.complete(credit) {
        credit = d.credit;
    }
    assert!(w.is_idle());
    let due = w.poll_timeout().unwrap_or(Instant::MAX);
    w.handle_timeout(due);
    let later = due.saturating_add(MAINTENANCE_INTERVAL);
    w.handle_timeout(later);
    w.handle_timeout(later.saturating_add(MAINTENANCE_INTERVAL));
    assert_eq!(w.poll_timeout(), None, "an idle window goes quiet");
    assert!(w.books.spare_queues.iter().all(|q| q.capacity() < 100));
}
