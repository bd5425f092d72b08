//! Unit tests of the dispatch window.

use super::*;
use crate::maintenance::MIN_CAPACITY;
use crate::test_hasher::TestHasher;
use alloc::collections::VecDeque;
use alloc::vec;
use core::time::Duration;

type Window = DispatchWindow<u32, &'static str, TestHasher>;

const T0: Instant = Instant::ZERO;

fn window(max_in_flight: u32) -> Window {
    match Window::new(WindowConfig::default().with_max_in_flight(max_in_flight as usize)) {
        Ok(w) => w,
        Err(e) => panic!("valid config refused: {e}"),
    }
}

/// Sends at once, or fails the test.
fn sent(
    r: Result<Option<Dispatch<u32, &'static str>>, SubmitError<&'static str>>,
) -> Dispatch<u32, &'static str> {
    match r {
        Ok(Some(d)) => d,
        other => panic!("expected a dispatch, got {other:?}"),
    }
}

fn conserved(w: &Window, shards: &[u32]) {
    for s in shards {
        assert_eq!(w.in_flight(s) + w.available(s), w.capacity(), "shard {s}");
    }
}

#[test]
fn default_is_four_and_zero_is_refused() {
    assert_eq!(WindowConfig::default().max_in_flight(), 4);
    let err = WindowConfig::default().with_max_in_flight(0).validate();
    assert!(matches!(
        err,
        Err(ConfigError::OutOfRange {
            option: &crate::options::window::MAX_IN_FLIGHT,
            got: 0,
            min: 1,
            ..
        })
    ));
    assert!(Window::new(WindowConfig::default().with_max_in_flight(0)).is_err());
}

#[test]
fn exhausted_shard_dispatches_queued_batches_fifo() {
    let mut w = window(2);
    let a = sent(w.submit(1, "a"));
    let b = sent(w.submit(1, "b"));
    for x in ["c", "d", "e"] {
        assert_eq!(w.submit(1, x), Ok(None));
    }
    assert_eq!((w.in_flight(&1), w.available(&1), w.queued(&1)), (2, 0, 3));
    let c = w.complete(a.credit).ok().flatten().map(|d| d.batch);
    assert_eq!(c, Some("c"));
    let mut order = vec![];
    let mut credit = b.credit;
    while let Ok(Some(d)) = w.complete(credit) {
        order.push(d.batch);
        credit = d.credit;
        conserved(&w, &[1]);
        assert!(w.in_flight(&1) <= 2);
    }
    assert_eq!(order, ["d", "e"]);
}

#[test]
fn release_dispatches_queued_before_parked() {
    let mut w = window(1);
    let a = sent(w.submit(1, "a"));
    assert_eq!(w.submit_or_park(1, "open"), Ok(None));
    assert_eq!(w.submit(1, "full"), Ok(None));
    assert!(w.is_parked(&1));
    let next = sent(Ok(w.complete(a.credit).unwrap_or(None)));
    assert_eq!(next.batch, "full");
    let last = sent(Ok(w.complete(next.credit).unwrap_or(None)));
    assert_eq!(last.batch, "open");
    assert!(!w.is_parked(&1));
    assert_eq!(w.complete(last.credit), Ok(None));
    assert_eq!(w.shard_count(), 0);
}

#[test]
fn reclaimed_batch_is_not_dispatched_by_release_and_next_submit_goes_at_once() {
    let mut w = window(1);
    let a = sent(w.submit(1, "a"));
    assert_eq!(w.submit_or_park(1, "open"), Ok(None));
    assert_eq!(w.reclaim(&1), Some("open"));
    assert_eq!(w.reclaim(&1), None, "reclaim takes it exactly once");
    assert_eq!(
        w.complete(a.credit),
        Ok(None),
        "nothing held back: the release sends nothing"
    );
    assert_eq!(w.shard_count(), 0);
    let d = sent(w.submit_or_park(1, "open+more"));
    assert_eq!(d.batch, "open+more");
    conserved(&w, &[1]);
}

#[test]
fn second_park_is_refused_and_hands_the_batch_back() {
    let mut w = window(1);
    let _a = sent(w.submit(1, "a"));
    assert_eq!(w.submit_or_park(1, "p"), Ok(None));
    let err = w.submit_or_park(1, "q");
    assert_eq!(err, Err(SubmitError::AlreadyParked("q")));
    assert_eq!(err.map_err(SubmitError::into_batch), Err("q"));
    assert_eq!(w.reclaim(&1), Some("p"));
}

#[test]
fn close_returns_held_back_batches_and_leaves_in_flight_ones() {
    let mut w = window(1);
    let a = sent(w.submit(1, "a"));
    assert_eq!(w.submit(1, "q1"), Ok(None));
    assert_eq!(w.submit(1, "q2"), Ok(None));
    assert_eq!(w.submit_or_park(1, "p"), Ok(None));
    let b = sent(w.submit(2, "b"));
    let mut held = w.close();
    held.sort_by_key(|(s, _)| *s); // shard order is unspecified; per-shard order is not
    assert_eq!(held, [(1, "q1"), (1, "q2"), (1, "p")]);
    assert!(w.is_closed());
    assert_eq!(
        (w.in_flight(&1), w.in_flight(&2)),
        (1, 1),
        "in-flight batches untouched"
    );
    assert_eq!((w.queued(&1), w.is_parked(&1)), (0, false));
    assert_eq!(w.submit(1, "late"), Err(SubmitError::Closed("late")));
    assert_eq!(
        w.submit_or_park(3, "late"),
        Err(SubmitError::Closed("late"))
    );
    assert_eq!(
        w.complete(a.credit),
        Ok(None),
        "after close a live credit frees its slot"
    );
    assert_eq!(w.complete(a.credit), Err(ReleaseError::AlreadyReleased));
    assert_eq!(w.complete(b.credit), Ok(None));
    assert_eq!((w.shard_count(), w.live_credits()), (0, 0));
    assert!(w.close().is_empty());
}

#[test]
fn double_and_bogus_completions_change_nothing() {
    let mut w = window(2);
    let a = sent(w.submit(1, "a"));
    let b = sent(w.submit(1, "b"));
    assert_eq!(w.submit(1, "c"), Ok(None));
    let c = sent(Ok(w.complete(a.credit).unwrap_or(None)));
    let before = (w.in_flight(&1), w.queued(&1), w.live_credits());
    assert_eq!(w.complete(a.credit), Err(ReleaseError::AlreadyReleased));
    assert_eq!(c.credit.slot(), a.credit.slot(), "the slot is reused ...");
    assert_ne!(
        c.credit, a.credit,
        "... under a new id, so the stale id cannot free it"
    );
    let tag = w.instance_tag();
    for bogus in [
        CreditId::forge(tag, 0, 0),
        CreditId::forge(tag, 0, 999),
        CreditId::forge(tag, u32::MAX, u64::MAX),
        CreditId::forge(tag, 7, u64::MAX - 1),
    ] {
        assert_eq!(w.complete(bogus), Err(ReleaseError::Unknown), "{bogus:?}");
    }
    // A forged id with an issued generation but the wrong slot: reported as released.
    assert_eq!(
        w.complete(CreditId::forge(tag, 9, 1)),
        Err(ReleaseError::AlreadyReleased)
    );
    assert_eq!((w.in_flight(&1), w.queued(&1), w.live_credits()), before);
    assert_eq!(w.complete(b.credit), Ok(None));
    assert_eq!(w.complete(c.credit), Ok(None));
    assert_eq!(w.complete(c.credit), Err(ReleaseError::AlreadyReleased));
    assert_eq!(w.shard_count(), 0);
}

#[test]
fn exhausted_shard_never_delays_another() {
    let mut w = window(1);
    let a = sent(w.submit(1, "a"));
    assert_eq!(w.submit(1, "a2"), Ok(None));
    assert_eq!(w.submit_or_park(1, "a3"), Ok(None));
    let b = sent(w.submit(2, "b"));
    assert_eq!(
        w.complete(b.credit),
        Ok(None),
        "shard 2's release never sends shard 1's work"
    );
    assert_eq!(w.queued(&1), 1);
    assert!(sent(w.submit_or_park(2, "b2")).batch == "b2");
    assert_eq!(sent(Ok(w.complete(a.credit).unwrap_or(None))).shard, 1);
    conserved(&w, &[1, 2]);
}

#[test]
#[cfg_attr(miri, ignore)]
fn idle_windows_are_removed_and_memory_follows_active_shards() {
    let mut w = window(4);
    for shard in 0..10_000u32 {
        let d = sent(w.submit(shard, "x"));
        assert_eq!(w.shard_count(), 1);
        assert_eq!(w.complete(d.credit), Ok(None));
        assert_eq!(w.shard_count(), 0);
    }
    assert_eq!(w.live_credits(), 0);
    assert!(w.books.credits.slots() <= 1, "the slab reuses slots");
    assert!(w.shards.capacity() <= 2 * MIN_CAPACITY);
    assert!(w.tracked_shards() <= w.shards.capacity());
}

#[test]
fn idle_shard_entry_is_kept_until_maintenance_evicts_it() {
    let mut w = window(2);
    let d = sent(w.submit(1, "a"));
    assert_eq!(w.complete(d.credit), Ok(None));
    assert_eq!(
        (w.shard_count(), w.tracked_shards()),
        (0, 1),
        "idle: not counted, but its entry stays for the next batch"
    );
    let d = sent(w.submit(1, "b"));
    assert_eq!((w.shard_count(), w.tracked_shards()), (1, 1));
    conserved(&w, &[1]);
    assert_eq!(w.complete(d.credit), Ok(None));
    let busy = sent(w.submit(2, "c"));
    w.handle_timeout(secs(1));
    assert_eq!(
        (w.shard_count(), w.tracked_shards()),
        (1, 1),
        "maintenance evicts the idle shard 1 and keeps the busy shard 2"
    );
    assert_eq!((w.in_flight(&1), w.available(&1)), (0, 2));
    assert_eq!(w.complete(busy.credit), Ok(None));
}

#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn a_map_full_of_idle_shards_evicts_them_instead_of_growing() {
    let mut w = window(1);
    let anchor = sent(w.submit(u32::MAX, "busy"));
    for shard in 0..1_000u32 {
        let d = sent(w.submit(shard, "x"));
        assert_eq!(w.complete(d.credit), Ok(None));
        assert!(w.tracked_shards() <= w.shards.capacity());
    }
    assert!(
        w.shards.capacity() <= 2 * MIN_CAPACITY,
        "one busy shard: the map never grows past a small table, without maintenance"
    );
    assert_eq!((w.shard_count(), w.in_flight(&u32::MAX)), (1, 1));
    assert_eq!(w.complete(anchor.credit), Ok(None));
}

/// Sends one batch and queues a second for each of `shards` shards, then completes every
/// credit (which sends the queued batches) until all are done.
fn burst(w: &mut Window, shards: u32) {
    let mut live = vec![];
    for s in 0..shards {
        live.push(sent(w.submit(s, "first")).credit);
        assert_eq!(w.submit(s, "queued"), Ok(None));
    }
    while let Some(c) = live.pop() {
        if let Ok(Some(d)) = w.complete(c) {
            live.push(d.credit);
        }
    }
    assert_eq!((w.shard_count(), w.live_credits()), (0, 0));
}

fn secs(n: u64) -> Instant {
    Instant::from_millis(n * 1000)
}

#[test]
fn idle_shards_keep_capacity_until_maintenance_after_a_quiet_period() {
    let mut w = window(1);
    assert_eq!(w.poll_timeout(), None, "nothing to give back yet");
    burst(&mut w, 200);
    let cap = w.shards.capacity();
    assert!(cap >= 200, "removing idle shards no longer shrinks the map");
    assert_eq!(
        w.books.spare_queues.len(),
        200,
        "one buffer per shard that queued"
    );
    assert_eq!(w.poll_timeout(), Some(secs(1)));
    w.handle_timeout(Instant::from_millis(999));
    assert_eq!(w.shards.capacity(), cap, "not due before the interval");
    w.handle_timeout(secs(1));
    assert_eq!(
        (w.shards.capacity(), w.books.spare_queues.len()),
        (cap, 200),
        "the period that just ended used all of it"
    );
    assert_eq!(
        w.poll_timeout(),
        Some(secs(2)),
        "a quieter period may follow"
    );
    w.handle_timeout(secs(2));
    assert!(w.shards.capacity() <= 2 * MIN_CAPACITY);
    assert!(w.books.spare_queues.is_empty() && w.books.spare_queues.capacity() <= 2 * MIN_CAPACITY);
    assert_eq!(w.books.credits.slots(), 0);
    assert_eq!(
        w.poll_timeout(),
        None,
        "everything given back: maintenance goes quiet"
    );
}

#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn repeated_bursts_keep_their_capacity_through_maintenance() {
    let mut w = window(1);
    let mut now = secs(0);
    let mut snapshot = None;
    for round in 0..8 {
        burst(&mut w, 64);
        now += Duration::from_millis(1500);
        w.handle_timeout(now); // runs every round, between bursts
        let caps = (
            w.shards.capacity(),
            w.books.spare_queues.len(),
            w.books.spare_queues.capacity(),
            w.books.credits.slot_capacity(),
        );
        if round >= 1 {
            assert_eq!(*snapshot.get_or_insert(caps), caps, "round {round}");
        }
    }
    burst(&mut w, 16); // a smaller burst: the next run still judges it against 64
    w.handle_timeout(now + Duration::from_millis(1500));
    assert_eq!(
        w.books.spare_queues.len(),
        16,
        "spares follow the recent peak"
    );
}

#[test]
fn maintenance_runs_once_per_interval_and_survives_time_running_backwards() {
    let mut w = window(2);
    let a = sent(w.submit(1, "a"));
    w.handle_timeout(secs(5));
    assert_eq!(w.poll_timeout(), Some(secs(6)));
    w.handle_timeout(secs(1)); // backwards: clamped to 5 s, not due
    assert_eq!(w.poll_timeout(), Some(secs(6)));
    assert_eq!(w.complete(a.credit), Ok(None));
    w.handle_timeout(Instant::MAX);
    w.handle_timeout(Instant::MAX); // the end of time: each call may run, none panics
    assert_eq!(w.poll_timeout(), None);
    let b = sent(w.submit(1, "b"));
    assert_eq!(w.poll_timeout(), Some(Instant::MAX), "deadlines saturate");
    assert_eq!(w.complete(b.credit), Ok(None));
    conserved(&w, &[1]);
}

#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn credit_ids_are_never_reused() {
    let mut w = window(3);
    let mut seen = vec![];
    let mut live: vec::Vec<CreditId> = vec![];
    for i in 0..3_000u32 {
        if live.len() == 3 || i % 5 == 4 {
            let c = live.remove(0);
            assert!(w.complete(c).is_ok());
        }
        if let Ok(Some(d)) = w.submit(i % 2, "x") {
            seen.push(d.credit);
            live.push(d.credit);
        }
    }
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n);
    assert!(w.books.credits.slots() <= 6);
}

#[test]
fn extreme_capacity_and_end_of_id_space_are_defined() {
    let mut w = window(u32::MAX);
    for _ in 0..100 {
        let _ = sent(w.submit(1, "x"));
    }
    assert_eq!(w.available(&1), u32::MAX - 100);
    conserved(&w, &[1]);

    let mut w = window(1);
    w.skip_generations_to(u64::MAX - 2);
    let a = sent(w.submit(1, "a"));
    assert_eq!(a.credit.generation(), u64::MAX - 2);
    assert_eq!(w.submit(1, "q"), Ok(None));
    let q = sent(Ok(w.complete(a.credit).unwrap_or(None)));
    assert_eq!(q.credit.generation(), u64::MAX - 1, "the last id");
    assert_eq!(w.submit(1, "r"), Ok(None));
    // No id left for "r": the release frees the slot and keeps "r" held back. Ids never
    // wrap: new batches are refused with `Exhausted`, and the window stays open for releases.
    assert_eq!(w.complete(q.credit), Ok(None));
    assert!(w.is_exhausted() && !w.is_closed());
    conserved(&w, &[1]);
    assert_eq!(w.submit(2, "s"), Err(SubmitError::Exhausted("s")));
    assert_eq!(w.close(), [(1, "r")]);
    assert_eq!(w.shard_count(), 0);
    assert_eq!(
        w.complete(CreditId::forge(w.instance_tag(), 0, u64::MAX)),
        Err(ReleaseError::Unknown)
    );
}

#[test]
fn another_windows_credit_and_ticket_are_unknown_and_change_nothing() {
    let mut one = window(1);
    let mut two = window(1);
    assert_ne!(one.instance_tag(), two.instance_tag());
    let mine = sent(one.submit(1, "a"));
    let Ok(Submitted::Queued(queued)) = one.enqueue(1, "b") else {
        panic!("no credit left: queued");
    };
    // The second window issues the same slots and generations.
    let theirs = sent(two.submit(1, "x"));
    let Ok(Submitted::Queued(their_ticket)) = two.enqueue(1, "y") else {
        panic!("no credit left: queued");
    };
    assert_eq!(
        (theirs.credit.slot(), theirs.credit.generation()),
        (mine.credit.slot(), mine.credit.generation())
    );
    assert_eq!(their_ticket.id(), queued.id());
    // Before the instance tag, this release widened the first window past max_in_flight.
    assert_eq!(one.complete(theirs.credit), Err(ReleaseError::Unknown));
    assert_eq!(one.cancel(their_ticket), Err(ReleaseError::Unknown));
    assert_eq!(
        (one.in_flight(&1), one.queued(&1), one.live_credits()),
        (1, 1, 1)
    );
    assert!(one.is_queued(queued) && !one.is_queued(their_ticket));
    let next = sent(Ok(one.complete(mine.credit).unwrap_or(None)));
    assert_eq!(next.batch, "b");
}

#[test]
fn a_cancelled_batch_leaves_the_line_and_the_next_one_is_served() {
    let mut w = window(1);
    let first = sent(w.submit(1, "a"));
    let tickets: Vec<Ticket> = ["b", "c", "d"]
        .into_iter()
        .map(|b| match w.enqueue(1, b) {
            Ok(Submitted::Queued(t)) => t,
            other => panic!("expected to queue, got {other:?}"),
        })
        .collect();
    assert_eq!(w.queued(&1), 3);
    // The head and a middle one leave; a second cancel of the same ticket is refused.
    assert_eq!(w.cancel(tickets[0]), Ok("b"));
    assert_eq!(w.cancel(tickets[0]), Err(ReleaseError::AlreadyReleased));
    assert_eq!(w.cancel(tickets[2]), Ok("d"));
    assert_eq!(w.queued(&1), 1);
    let next = sent(Ok(w.complete(first.credit).unwrap_or(None)));
    assert_eq!(next.batch, "c", "the oldest batch still in line");
    assert_eq!(
        w.cancel(tickets[1]),
        Err(ReleaseError::AlreadyReleased),
        "dispatched: it left the line"
    );
    assert_eq!(w.complete(next.credit), Ok(None));
    assert_eq!((w.shard_count(), w.live_credits()), (0, 0));
}

#[test]
fn cancelling_many_keeps_the_line_bounded() {
    let mut w = window(1);
    let held = sent(w.submit(1, "held"));
    let mut keep = Vec::new();
    // Under miri 300 (still many compactions of the line): each step is slow there.
    for i in 0..if cfg!(miri) { 300 } else { 1_000u32 } {
        let Ok(Submitted::Queued(t)) = w.enqueue(1, "x") else {
            panic!("queued");
        };
        if i % 10 == 9 {
            keep.push(t);
        } else {
            assert_eq!(w.cancel(t), Ok("x"));
        }
    }
    assert_eq!(w.queued(&1), keep.len());
    let line = w.shards.iter().map(|e| e.w.line.len()).max().unwrap_or(0);
    assert!(
        line <= 2 * keep.len() + 8,
        "line of {line} entries for {} live",
        keep.len()
    );
    // Everything left is served in order.
    let mut credit = held.credit;
    for t in &keep {
        assert!(w.is_queued(*t));
        let d = sent(Ok(w.complete(credit).unwrap_or(None)));
        assert!(!w.is_queued(*t));
        credit = d.credit;
    }
    assert_eq!(w.complete(credit), Ok(None));
    assert_eq!((w.shard_count(), w.live_credits(), w.queued(&1)), (0, 0, 0));
}

/// `close` copies each held-back batch's key (user `Clone`) for its answer. It made the
/// copies while it drained the shards, so a panicking clone left the window closed with
/// batches lost; now every copy is made first, and the panic leaves it open and unchanged.
#[test]
fn a_key_clone_panicking_in_close_leaves_the_window_open_and_unchanged() {
    use crate::test_key::{Call, PanicKey, panics};
    use alloc::format;
    type KeyWindow = DispatchWindow<PanicKey, &'static str, TestHasher>;
    let Ok(mut w) = KeyWindow::new(WindowConfig::default().with_max_in_flight(1)) else {
        panic!("valid config refused");
    };
    let a = w.submit(PanicKey(1), "a");
    assert!(matches!(a, Ok(Some(_))));
    assert!(matches!(w.submit(PanicKey(1), "b"), Ok(None)));
    assert!(matches!(w.submit(PanicKey(2), "c"), Ok(Some(_))));
    assert!(matches!(w.submit_or_park(PanicKey(2), "d"), Ok(None)));
    let before = format!("{w:?}");
    for (key, skip) in [(1, 0), (2, 0)] {
        assert!(panics(key, Call::Clone, skip, || {
            let _ = w.close();
        }));
        assert_eq!(format!("{w:?}"), before, "key {key}: the window changed");
        assert!(!w.is_closed());
    }
    let mut out: Vec<(u32, &str)> = w.close().into_iter().map(|(k, b)| (k.0, b)).collect();
    out.sort_unstable();
    assert_eq!(out, vec![(1, "b"), (2, "d")], "every held-back batch, once");
}

#[test]
fn usize_limits_clamp_to_what_the_window_counts() {
    assert_eq!(
        WindowConfig::default()
            .with_max_in_flight(7)
            .max_in_flight(),
        7usize
    );
    // Above `u32::MAX` the window counts `u32::MAX` credits per shard; the config keeps the
    // value as given.
    let big = usize::try_from(u64::from(u32::MAX) + 1).unwrap_or(usize::MAX);
    for limit in [big, usize::MAX] {
        let cfg = WindowConfig::default().with_max_in_flight(limit);
        assert_eq!(cfg.max_in_flight(), limit);
        assert_eq!(cfg.validate(), Ok(()));
        let mut w = match Window::new(cfg) {
            Ok(w) => w,
            Err(e) => panic!("{limit} refused: {e}"),
        };
        assert_eq!(w.capacity(), u32::MAX);
        for _ in 0..3 {
            let _ = sent(w.submit(1, "x"));
        }
        assert_eq!(w.available(&1), u32::MAX - 3);
        let single = match SingleWindow::<&str>::new(cfg) {
            Ok(s) => s,
            Err(e) => panic!("{limit} refused: {e}"),
        };
        assert_eq!(single.capacity(), u32::MAX);
    }
    // Zero is still refused, naming the option, for both window types.
    let zero = WindowConfig::default().with_max_in_flight(0);
    assert!(Window::new(zero).is_err());
    assert!(matches!(
        SingleWindow::<&str>::new(zero),
        Err(ConfigError::OutOfRange {
            option: &crate::options::window::MAX_IN_FLIGHT,
            got: 0,
            ..
        })
    ));
}

#[test]
fn configs_valid_by_construction_build_windows_infallibly() {
    let two = NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN);
    assert_eq!(WindowConfig::new(two).max_in_flight(), 2);
    assert_eq!(WindowConfig::new(two).validate(), Ok(()));
    let mut w: Window = DispatchWindow::limited(two, TestHasher::default());
    assert_eq!(w.capacity(), 2);
    let _ = sent(w.submit(1, "a"));
    let _ = sent(w.submit(1, "b"));
    assert_eq!(w.submit(1, "c"), Ok(None));
    let s = SingleWindow::<&str>::limited(two);
    assert_eq!(s.capacity(), 2);
    assert_eq!(SingleWindow::<&str>::default().capacity(), 4);
}

/// Completes `credit` and every credit its dispatches hand on, in order; returns the batches
/// sent, in the order they left.
fn complete_all(w: &mut Window, credits: &[CreditId]) -> Vec<(u32, &'static str)> {
    let mut live: VecDeque<CreditId> = credits.iter().copied().collect();
    let mut sent_now = vec![];
    while let Some(c) = live.pop_front() {
        match w.complete(c) {
            Ok(Some(d)) => {
                sent_now.push((d.shard, d.batch));
                live.push_back(d.credit);
            }
            Ok(None) => {}
            Err(e) => panic!("live credit refused: {e}"),
        }
        conserved(w, &[1, 2]);
    }
    sent_now
}

#[test]
fn drain_refuses_new_batches_and_sends_held_ones_whole_and_in_order() {
    let mut w = window(1);
    let a = sent(w.submit(1, "a"));
    let b = sent(w.submit(2, "b"));
    assert_eq!(w.submit(1, "q1"), Ok(None));
    let Ok(Submitted::Queued(t)) = w.enqueue(1, "q2") else {
        panic!("no credit: queued");
    };
    assert_eq!(w.submit_or_park(1, "open1"), Ok(None));
    assert_eq!(w.submit(2, "q3"), Ok(None));
    w.drain();
    w.drain(); // idempotent
    assert!(w.is_closed() && w.is_draining() && !w.is_drained());
    assert_eq!(w.submit(3, "x"), Err(SubmitError::Closed("x")));
    assert_eq!(w.enqueue(1, "y"), Err(SubmitError::Closed("y")));
    assert_eq!(w.submit_or_park(2, "z"), Err(SubmitError::Closed("z")));
    // The queued batch is still queued and cancellable.
    assert!(w.is_queued(t));
    let left = complete_all(&mut w, &[a.credit, b.credit]);
    let shard = |s: u32| -> Vec<&str> {
        left.iter()
            .filter(|(k, _)| *k == s)
            .map(|(_, b)| *b)
            .collect()
    };
    assert_eq!(
        shard(1),
        ["q1", "q2", "open1"],
        "queued in order, then parked"
    );
    assert_eq!(shard(2), ["q3"]);
    assert!(w.is_drained() && w.shard_count() == 0 && w.live_credits() == 0);
    assert!(w.close().is_empty());
    assert!(!w.is_draining() && w.is_drained());
}

#[test]
fn close_during_a_drain_returns_what_it_has_not_sent() {
    let mut w = window(1);
    let a = sent(w.submit(1, "a"));
    assert_eq!(w.submit(1, "b"), Ok(None));
    assert_eq!(w.submit(1, "c"), Ok(None));
    w.drain();
    let b = sent(Ok(w.complete(a.credit).unwrap_or(None)));
    assert_eq!(b.batch, "b");
    assert_eq!(w.close(), [(1, "c")]);
    assert!(!w.is_draining() && w.is_closed() && !w.is_drained());
    // Closed now: the release sends nothing, and the window is drained.
    assert_eq!(w.complete(b.credit), Ok(None));
    assert!(w.is_drained());
    // A drain after close changes nothing.
    w.drain();
    assert!(!w.is_draining());
}

#[test]
fn a_cancel_or_reclaim_while_draining_hands_the_batch_back() {
    let mut w = window(1);
    let a = sent(w.submit(1, "a"));
    let Ok(Submitted::Queued(t)) = w.enqueue(1, "q") else {
        panic!("no credit: queued");
    };
    assert_eq!(w.submit_or_park(1, "open"), Ok(None));
    w.drain();
    assert_eq!(w.cancel(t), Ok("q"));
    assert_eq!(w.reclaim(&1), Some("open"));
    assert_eq!(w.complete(a.credit), Ok(None));
    assert!(w.is_drained());
}

#[test]
fn a_paused_shard_sends_nothing_and_resume_hands_credit_out_in_arrival_order() {
    // Two in flight per shard. Shard 7: "a" in flight; paused; then "b" and "c" queued and
    // "open" parked although one credit is free; the release of "a" hands nothing on.
    let mut w = window(2);
    let a = sent(w.submit(7, "a"));
    w.pause(7);
    assert!(w.is_paused(&7));
    assert_eq!(w.available(&7), 1);
    assert_eq!(w.submit(7, "b"), Ok(None));
    assert_eq!(w.submit(7, "c"), Ok(None));
    assert_eq!(w.submit_or_park(7, "open"), Ok(None));
    assert_eq!(
        w.complete(a.credit),
        Ok(None),
        "paused: the release hands nothing on"
    );
    // Other shards are not affected.
    let x = sent(w.submit(8, "x"));
    assert_eq!(x.shard, 8);
    // Resume: two free credits, so the two oldest leave, in order; the parked one waits.
    let out: Vec<_> = w
        .resume(T0, &7)
        .into_iter()
        .map(|d| (d.shard, d.batch))
        .collect();
    assert_eq!(out, [(7, "b"), (7, "c")]);
    assert!(!w.is_paused(&7));
    assert_eq!(w.in_flight(&7), 2);
    assert!(w.is_parked(&7));
    conserved(&w, &[7, 8]);
    // A second resume does nothing; a release now hands on as usual.
    assert!(w.resume(T0, &7).is_empty());
    let live = w.live_credits();
    assert_eq!(live, 3);
}

#[test]
fn pausing_an_unknown_shard_keeps_one_entry_until_resumed_and_close_ends_it() {
    let mut w = window(1);
    for _ in 0..3 {
        w.pause(9); // idempotent: one entry
    }
    assert_eq!(w.tracked_shards(), 1);
    assert_eq!(w.shard_count(), 0, "a paused shard with nothing is idle");
    // Maintenance does not evict it (the pause would be lost).
    w.handle_timeout(secs(1000));
    w.handle_timeout(secs(2000));
    assert_eq!(w.tracked_shards(), 1);
    assert!(w.is_paused(&9));
    assert_eq!(
        w.submit(9, "a"),
        Ok(None),
        "the first batch of a paused shard waits"
    );
    assert_eq!(w.shard_count(), 1);
    let out = w.resume(T0, &9);
    assert_eq!(out.len(), 1);
    assert_eq!(w.complete(out[0].credit), Ok(None));
    // Resumed and idle: evictable again.
    w.handle_timeout(secs(3000));
    assert_eq!(w.tracked_shards(), 0);
    let mut w2 = window(1);
    w2.pause(1);
    w2.pause(2);
    assert_eq!(w2.submit(1, "held"), Ok(None));
    // Close fails what a paused shard holds and ends every pause.
    assert_eq!(w2.close(), [(1, "held")]);
    assert!(!w2.is_paused(&1) && !w2.is_paused(&2));
    w2.pause(3);
    assert!(!w2.is_paused(&3), "pause after close does nothing");
    assert!(w2.is_drained());
}

#[test]
fn drain_keeps_a_pause_and_is_drained_only_after_resume() {
    let mut w = window(1);
    w.pause(7);
    assert_eq!(w.submit(7, "a"), Ok(None));
    w.drain();
    assert!(!w.is_drained(), "the held batch waits for the resume");
    let out = w.resume(T0, &7);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].batch, "a");
    assert_eq!(w.complete(out[0].credit), Ok(None));
    assert!(w.is_drained());
}

#[test]
fn single_window_pause_and_resume_follow_the_same_rules() {
    let mut w = SingleWindow::limited(NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN));
    let a = w.submit("a").unwrap().unwrap();
    w.pause();
    assert_eq!(w.submit("b"), Ok(None));
    assert_eq!(w.complete(a.credit), Ok(None));
    assert_eq!(w.submit_or_park("open"), Ok(None));
    let out: Vec<_> = w.resume(T0).into_iter().map(|d| d.batch).collect();
    assert_eq!(out, ["b", "open"]);
    assert!(!w.is_paused());
}

#[test]
fn window_events_are_off_by_default_and_record_each_dispatch_and_release_once_on() {
    let mut w = window(1);
    let a = sent(w.submit(1, "a"));
    assert_eq!(w.poll_event(), None, "off by default");
    assert!(w.complete(a.credit).is_ok());
    assert_eq!(w.poll_event(), None);

    w.set_event_capacity(16);
    let b = sent(w.submit(1, "b"));
    assert_eq!(w.submit(1, "c"), Ok(None), "queued");
    let c = w
        .complete(b.credit)
        .unwrap()
        .expect("the queued batch leaves");
    assert!(w.complete(b.credit).is_err(), "a second release is refused");
    w.pause(2);
    assert_eq!(w.submit(2, "d"), Ok(None), "paused: queued");
    let d = w.resume(T0, &2);
    assert_eq!(d.len(), 1);
    let events: Vec<_> = core::iter::from_fn(|| w.poll_event()).collect();
    assert_eq!(
        events,
        [
            WindowEvent::Dispatched {
                shard: 1,
                credit: b.credit
            },
            WindowEvent::Released {
                credit: b.credit,
                in_flight: 1
            },
            WindowEvent::Dispatched {
                shard: 1,
                credit: c.credit
            },
            WindowEvent::Dispatched {
                shard: 2,
                credit: d[0].credit
            },
        ],
        "a refused release records nothing"
    );
    assert_eq!(w.events_dropped(), 0);
}

#[test]
fn single_window_events_match_the_dispatches_and_a_full_queue_keeps_the_newest() {
    let mut w: SingleWindow<&str> = SingleWindow::limited(NonZeroUsize::MIN);
    w.set_event_capacity(2);
    let a = w.submit("a").unwrap().expect("sent");
    assert_eq!(w.submit_or_park("open"), Ok(None), "parked");
    let next = w
        .complete(a.credit)
        .unwrap()
        .expect("the parked batch leaves");
    assert_eq!(
        (w.poll_event(), w.poll_event(), w.poll_event()),
        (
            Some(WindowEvent::Released {
                credit: a.credit,
                in_flight: 1
            }),
            Some(WindowEvent::Dispatched {
                shard: (),
                credit: next.credit
            }),
            None
        )
    );
    assert_eq!(w.events_dropped(), 1, "the first Dispatched was evicted");
    w.set_event_capacity(0);
    assert!(w.complete(next.credit).is_ok());
    assert_eq!(w.poll_event(), None, "off again");
}

// ------------------------------------------------------------------- paged snapshot (issue 16)

/// Walks the window's snapshot with pages of `max`, running `between` after each page.
fn walk_window(
    w: &mut Window,
    max: usize,
    mut between: impl FnMut(&mut Window, usize),
) -> alloc::vec::Vec<ShardSnapshot<u32>> {
    let (mut seen, mut from, mut pages) = (alloc::vec::Vec::new(), None, 0);
    loop {
        let page = w.snapshot(from, max);
        assert!(page.items.len() <= max.max(1));
        seen.extend(page.items);
        pages += 1;
        match page.next {
            Some(next) => from = Some(next),
            None => return seen,
        }
        between(w, pages);
    }
}

#[test]
fn a_snapshot_lists_each_shard_once_with_its_counts() {
    let mut w = window(2);
    let a = w.submit(1, "a").unwrap().unwrap();
    let _ = w.submit(1, "b").unwrap().unwrap();
    assert!(w.submit(1, "queued").unwrap().is_none());
    let _ = w.submit(2, "c").unwrap().unwrap();
    w.pause(2);
    let mut seen = walk_window(&mut w, 1, |_, _| {});
    seen.sort_by_key(|s| s.shard);
    let plain: alloc::vec::Vec<_> = seen
        .iter()
        .map(|s| {
            (
                s.shard,
                s.in_flight,
                s.available,
                s.queued,
                s.parked,
                s.paused,
            )
        })
        .collect();
    assert_eq!(
        plain,
        [(1, 2, 0, 1, false, false), (2, 1, 1, 0, false, true)]
    );
    // An empty window: one empty page that ends the walk.
    let empty = window(1).snapshot(None, 4);
    assert_eq!((empty.items.len(), empty.next), (0, None));
    let _ = a;
}

#[test]
fn a_walk_over_a_window_that_rehashes_between_pages_lists_every_steady_shard_exactly_once() {
    let mut w = window(1);
    let mut credits = alloc::vec::Vec::new();
    for shard in 0..30u32 {
        credits.push(w.submit(shard, "x").unwrap().unwrap().credit);
    }
    // Between the first pages: grow the table to several times its size (it rehashes) with
    // new shards; after every page, release one of the first shards' credits (they go idle,
    // and may be evicted to make room). Small enough for miri.
    let mut next_new = 1_000u32;
    let seen = walk_window(&mut w, 7, |w, page| {
        for _ in 0..if page <= 4 { 25 } else { 0 } {
            let _ = w.submit(next_new, "new").unwrap();
            next_new += 1;
        }
        if let Some(c) = credits.get(page).filter(|_| page < 10) {
            let _ = w.complete(*c);
        }
    });
    // Shards 10..30 held their credit throughout: each is listed exactly once.
    for shard in 10..30u32 {
        let n = seen.iter().filter(|s| s.shard == shard).count();
        assert_eq!(n, 1, "shard {shard} listed {n} times");
    }
    // Nothing is listed twice, new shards included.
    let mut all: alloc::vec::Vec<_> = seen.iter().map(|s| s.shard).collect();
    all.sort_unstable();
    let len = all.len();
    all.dedup();
    assert_eq!(all.len(), len, "a shard listed twice");
}

#[test]
fn a_shard_with_its_own_limit_keeps_its_entry_until_the_limit_is_cleared() {
    let mut w = window(1);
    let d = sent(w.submit(1, "a"));
    assert!(w.set_max_in_flight(&1, NonZeroUsize::new(3)).is_empty());
    assert!(w.set_max_in_flight(&2, NonZeroUsize::new(2)).is_empty());
    assert_eq!(w.shard_count(), 1, "an idle limited shard is not active");
    assert_eq!(w.complete(d.credit), Ok(None));
    w.handle_timeout(secs(1));
    w.handle_timeout(secs(100));
    assert_eq!(w.tracked_shards(), 2, "both limited idle entries kept");
    assert_eq!(
        (w.capacity_of(&1), w.capacity_of(&2), w.capacity_of(&3)),
        (3, 2, 1)
    );
    let page = w.snapshot(None, 10);
    let mut caps: Vec<_> = page.items.iter().map(|s| (s.shard, s.capacity)).collect();
    caps.sort_unstable();
    assert_eq!(caps, [(1, 3), (2, 2)]);
    assert!(w.set_max_in_flight(&1, None).is_empty());
    assert!(w.set_max_in_flight(&2, None).is_empty());
    assert!(
        w.set_max_in_flight(&4, None).is_empty(),
        "no entry made for no limit"
    );
    w.handle_timeout(secs(200));
    w.handle_timeout(secs(300));
    assert_eq!(w.tracked_shards(), 0, "cleared limits: evicted");
}

#[test]
fn a_grown_limit_sends_queued_then_parked_and_close_ends_the_limit() {
    let mut w = window(1);
    let a = sent(w.submit(7, "a"));
    assert_eq!(w.submit(7, "b"), Ok(None));
    assert_eq!(w.submit_or_park(7, "open"), Ok(None));
    let out: Vec<_> = w
        .set_max_in_flight(&7, NonZeroUsize::new(usize::MAX))
        .into_iter()
        .map(|d| (d.shard, d.batch))
        .collect();
    assert_eq!(out, [(7, "b"), (7, "open")]);
    assert_eq!((w.capacity_of(&7), w.in_flight(&7)), (u32::MAX, 3));
    assert!(w.close().is_empty());
    assert_eq!(w.capacity_of(&7), 1, "close ends the limit");
    assert!(w.set_max_in_flight(&7, NonZeroUsize::new(5)).is_empty());
    assert_eq!(w.capacity_of(&7), 1, "nothing changes after close");
    assert_eq!(w.complete(a.credit), Ok(None));
}
