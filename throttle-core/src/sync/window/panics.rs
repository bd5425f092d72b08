//! The window handle when user code panics (issue 12): a shard key whose `Hash`, `Eq` or
//! `Clone` panics at each of its calls in turn, under the lock and outside it, and wakers that
//! panic. After every panic the handle must still serve: no credit or waiter slot stranded,
//! `in_flight + available == capacity` per shard, and the line's FIFO order intact.

use alloc::collections::VecDeque;
use alloc::vec;
use alloc::vec::Vec;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::*;
use crate::sync::panic_support::{
    PanickingWaker, Point, TrapKey, arm, close_while_listened, disarm, sweep, trapped,
};
use crate::sync::test_support::{CountingWaker, WakeCount, poll_once};
use crate::test_hasher::TestHasher;

type Handle = WindowHandle<TrapKey, TestHasher>;
type Owned = OwnedPermit<TrapKey, TestHasher>;

/// Every shard a fixture or an operation touches.
const SHARDS: [u32; 4] = [1, 2, 3, 4];

/// An acquire of a named submitter, polled by hand.
struct Waiter {
    name: &'static str,
    fut: Acquire<'static, TrapKey, TestHasher>,
    waker: Waker,
    wakes: WakeCount,
}

impl Waiter {
    /// Runs the key's `Hash` (the future hashes its key when it is made).
    fn new(h: &Handle, name: &'static str, shard: u32) -> Self {
        let (waker, wakes) = CountingWaker::new();
        Waiter {
            name,
            fut: h.acquire_owned(TrapKey(shard)),
            waker,
            wakes,
        }
    }

    fn poll(&mut self) -> Poll<Result<Owned, Closed>> {
        poll_once(&mut self.fut, &self.waker)
    }

    fn is_waiting(&self) -> bool {
        matches!(self.fut.state, AcquireState::Waiting(_))
    }
}

/// A window of one credit per shard: shard 1's credit is held and `a`, `b` wait for it in
/// that order; shard 2 has an idle entry; shards 3 and 4 are new.
struct Fixture {
    h: Handle,
    holder: Option<Owned>,
    /// Shard 1's line, oldest first; an operation's new waiter for shard 1 joins the back.
    line: Vec<Waiter>,
    /// Permits an operation took.
    permits: Vec<Owned>,
}

fn fixture() -> Fixture {
    let h = match Handle::with_hasher(
        WindowConfig::default().with_max_in_flight(1),
        TestHasher::default(),
    ) {
        Ok(h) => h,
        Err(e) => panic!("valid config refused: {e}"),
    };
    let holder = h.try_acquire_owned(TrapKey(1)).expect("shard 1 is free");
    drop(h.try_acquire_owned(TrapKey(2)).expect("shard 2 is free"));
    let mut line = vec![Waiter::new(&h, "a", 1), Waiter::new(&h, "b", 1)];
    for w in &mut line {
        assert!(w.poll().is_pending());
    }
    Fixture {
        h,
        holder: Some(holder),
        line,
        permits: Vec::new(),
    }
}

/// The window's invariants, per shard and for the waiter arena (trap disarmed).
fn check_invariants(f: &Fixture) {
    let h = &f.h;
    for s in SHARDS {
        let k = TrapKey(s);
        assert_eq!(
            h.in_flight(&k) + h.available(&k),
            h.capacity_of(&k),
            "shard {s}: in_flight + available == capacity"
        );
        assert!(
            h.available(&k) == 0 || h.waiting(&k) == 0,
            "shard {s}: no free credit beside a line"
        );
    }
    let waiting = f.line.iter().filter(|w| w.is_waiting()).count();
    assert_eq!(
        h.total(|st| st.waiters.len()),
        waiting,
        "the arena holds exactly the waiting futures"
    );
    assert_eq!(h.stats().refused_releases, 0);
}

/// Serves shard 1 to the end and checks the order: the waiters still in line, oldest first,
/// then a newcomer `z`; then, with everything released, nothing is live. A closed handle
/// fails every waiter instead.
fn serve_to_the_end(f: &mut Fixture) {
    let h = f.h.clone();
    let mut line: VecDeque<Waiter> = f.line.drain(..).filter(Waiter::is_waiting).collect();
    let mut expected: Vec<&str> = line.iter().map(|w| w.name).collect();
    let mut served = Vec::new();
    let mut holder = f.holder.take();
    if h.is_closed() {
        for mut w in line {
            assert!(
                matches!(w.poll(), Poll::Ready(Err(Closed))),
                "{} fails after close",
                w.name
            );
        }
    } else {
        let mut z = Waiter::new(&h, "z", 1);
        match z.poll() {
            Poll::Pending => line.push_back(z),
            Poll::Ready(Ok(p)) => {
                assert!(
                    line.is_empty() && holder.is_none(),
                    "z barged past the line"
                );
                served.push("z");
                holder = Some(p);
            }
            Poll::Ready(Err(e)) => panic!("z: {e}"),
        }
        expected.push("z");
        while let Some(mut w) = line.pop_front() {
            drop(holder.take());
            match w.poll() {
                Poll::Ready(Ok(p)) => {
                    assert!(w.wakes.wakes() > 0, "{} was served without a wake", w.name);
                    served.push(w.name);
                    holder = Some(p);
                }
                Poll::Ready(Err(e)) => panic!("{}: {e}", w.name),
                Poll::Pending => panic!("{} was not served: the line is stuck", w.name),
            }
        }
        assert_eq!(served, expected, "shard 1 serves its line in FIFO order");
    }
    drop(holder);
    f.permits.clear();
    assert_eq!(
        (h.live_credits(), h.total(|st| st.waiters.len())),
        (0, 0),
        "nothing stranded"
    );
    assert_eq!(h.stats().refused_releases, 0);
    for s in SHARDS {
        let k = TrapKey(s);
        assert_eq!(h.available(&k), h.capacity_of(&k), "shard {s} serves again");
    }
    let again = h.try_acquire(TrapKey(3));
    assert_eq!(again.is_ok(), !h.is_closed(), "a later caller is served");
}

/// Re-polls waiter `i` with a waker that panics when woken; it stays in line. Returns that
/// waker's wake count.
fn repoll_with_a_panicking_waker(f: &mut Fixture, i: usize) -> WakeCount {
    let (bad, bad_wakes) = PanickingWaker::new();
    assert!(poll_once(&mut f.line[i].fut, &bad).is_pending());
    bad_wakes
}

/// The head of the line was handed the credit: checks the invariants, lets it take the
/// credit and hold it, then serves the rest to the end.
fn head_takes_its_credit_then_serve(f: &mut Fixture) {
    check_invariants(f);
    let Poll::Ready(Ok(p)) = f.line[0].poll() else {
        panic!("{} was handed the credit", f.line[0].name);
    };
    f.line.remove(0);
    f.holder = Some(p);
    serve_to_the_end(f);
}

/// Panics at every user call of `op` on a fresh fixture, then checks the invariants and
/// serves the line to the end; returns the points `op` reaches.
fn sweep_window(op: impl FnMut(&mut Fixture)) -> Vec<Point> {
    sweep(fixture, op, |f, _| {
        check_invariants(f);
        serve_to_the_end(f);
    })
}

use Point::{Clone as C, Eq as E, Hash as H};

#[test]
fn try_acquire_survives_a_panic_at_each_key_call() {
    // A shard with a line: refused, after the handle's hash and the lookup.
    let points = sweep_window(|f| {
        assert_eq!(
            f.h.try_acquire_owned(TrapKey(1)).err(),
            Some(TryAcquireError::NoCredit)
        );
    });
    assert_eq!(points, [H, E]);
    // An idle entry: found by the lookup, its credit issued.
    let points = sweep_window(|f| {
        f.permits
            .push(f.h.try_acquire_owned(TrapKey(2)).expect("free"))
    });
    assert_eq!(points, [H, E]);
    // A new shard: the window hashes the key itself and clones it, before it changes anything.
    let points = sweep_window(|f| {
        f.permits
            .push(f.h.try_acquire_owned(TrapKey(3)).expect("free"))
    });
    assert_eq!(points, [H, H, C]);
}

#[test]
fn a_first_poll_survives_a_panic_at_each_key_call() {
    // Joins the line: the hash when the future is made, then the lookups of `try_take` and of
    // the enqueue. A panic in the enqueue's lookup used to strand the slot inserted before it.
    let points = sweep_window(|f| {
        f.line.push(Waiter::new(&f.h, "c", 1));
        let c = f.line.last_mut().expect("just pushed");
        assert!(c.poll().is_pending());
    });
    assert_eq!(points, [H, E, E]);
    // Takes a new shard's credit at once.
    let points = sweep_window(|f| {
        let mut d = Waiter::new(&f.h, "d", 4);
        match d.poll() {
            Poll::Ready(Ok(p)) => f.permits.push(p),
            _ => panic!("shard 4 is free"),
        }
    });
    assert_eq!(points, [H, H, C]);
}

#[test]
fn a_limit_change_survives_a_panic_at_each_key_call() {
    // Shard 1 grows to 2: the head of its line, `a`, is handed the new credit, after the
    // handle's hash and the lookup.
    let points = sweep_window(|f| {
        let two = core::num::NonZeroUsize::new(2);
        assert_eq!(f.h.set_max_in_flight(&TrapKey(1), two), 1);
        assert_eq!(f.line[0].wakes.wakes(), 1, "a was woken");
    });
    assert_eq!(points, [H, E]);
    // A new shard gets an entry holding its limit: the window hashes the key itself and
    // clones it, before it changes anything.
    let points = sweep_window(|f| {
        let two = core::num::NonZeroUsize::new(2);
        assert_eq!(f.h.set_max_in_flight(&TrapKey(3), two), 0);
        assert_eq!(f.h.capacity_of(&TrapKey(3)), 2);
    });
    // Then the query: the handle's hash, the window's, and the lookup.
    assert_eq!(points, [H, H, C, H, H, E]);
}

#[test]
fn releases_cancels_re_polls_and_close_run_no_key_code() {
    assert_eq!(sweep_window(|f| drop(f.holder.take())), []);
    assert_eq!(
        sweep_window(|f| drop(f.line.remove(1))),
        [],
        "a waiter leaves"
    );
    assert_eq!(
        sweep_window(|f| {
            drop(f.holder.take()); // handed to `a`
            drop(f.line.remove(0)); // `a` leaves: its credit goes on to `b`
        }),
        []
    );
    assert_eq!(
        sweep_window(|f| assert!(f.line[0].poll().is_pending())),
        [],
        "a re-poll"
    );
    assert_eq!(sweep_window(|f| f.h.close()), []);
}

#[test]
fn queries_survive_a_panic_at_each_key_call() {
    let points = sweep_window(|f| {
        let k = TrapKey(1);
        assert_eq!(
            (f.h.in_flight(&k), f.h.available(&k), f.h.waiting(&k)),
            (1, 0, 2)
        );
    });
    // Each query hashes the key once to find its stripe, and the stripe's window once more.
    assert_eq!(points, [H, H, E, H, H, E, H, H, E]);
}

/// The case: with the line kept by the handle, a waiter that left re-hashed its key
/// to relink the line; a `Hash` that panicked there left the line's head naming a dead slot,
/// the next release handed the credit to it, and the shard never served again. The window now
/// keeps the line and names the shard by its stored hash, so a leaving waiter runs no key code.
#[test]
fn a_key_whose_hash_panics_cannot_break_the_line_when_its_head_or_tail_leaves() {
    for leaves in ["a", "b"] {
        let mut f = fixture();
        f.line.push(Waiter::new(&f.h, "c", 1));
        assert!(f.line[2].poll().is_pending());
        let i = f
            .line
            .iter()
            .position(|w| w.name == leaves)
            .expect("in line");
        let w = f.line.remove(i);
        let tail = f.line.pop().expect("c");
        // The head (`a`) or a middle waiter (`b`) leaves, then the tail (`c`), each with the
        // trap set at the very next key call.
        for leaving in [w, tail] {
            arm(0);
            let left = catch_unwind(AssertUnwindSafe(|| drop(leaving)));
            let sprung = disarm();
            assert!(
                left.is_ok() && sprung.is_none(),
                "leaving the line ran key code: {sprung:?}"
            );
        }
        check_invariants(&f);
        serve_to_the_end(&mut f);
    }
}

#[test]
fn a_panicking_waker_is_still_handed_its_credit_and_the_releaser_carries_on() {
    let mut f = fixture();
    // `a` re-registers with a waker that panics.
    let bad_wakes = repoll_with_a_panicking_waker(&mut f, 0);
    let released = catch_unwind(AssertUnwindSafe(|| f.holder.take().map(Permit::complete)));
    assert_eq!(
        released.ok().flatten(),
        Some(Released::HandedOn),
        "the release returns normally"
    );
    assert_eq!(bad_wakes.wakes(), 1);
    // `a` holds the credit: its next poll takes it, and the line goes on after it.
    head_takes_its_credit_then_serve(&mut f);
}

#[test]
fn close_wakes_every_waiter_and_the_closed_listener_even_if_a_waker_panics() {
    let mut f = fixture();
    // `b` re-registers with a waker that panics; `a` is handed the credit, which the close
    // takes back, so the close leaves nothing live and also wakes the `closed()` listener.
    let bad_wakes = repoll_with_a_panicking_waker(&mut f, 1);
    let h = f.h.clone();
    drop(f.holder.take());
    let (mut closed, w, closed_wakes) = close_while_listened(h.closed(), || h.close());
    assert_eq!(bad_wakes.wakes(), 1, "b's waker was woken, and panicked");
    assert_eq!(
        closed_wakes.wakes(),
        1,
        "the closed() listener is woken after it"
    );
    assert!(poll_once(&mut closed, &w).is_ready());
    serve_to_the_end(&mut f);
}

/// A permit dropped while its task unwinds hands the credit on; a waker that panics then must
/// not turn the unwind into an abort (a second panic escaping a `Drop` during unwinding).
#[test]
fn a_permit_dropped_by_an_unwinding_task_hands_on_even_to_a_panicking_waker() {
    let mut f = fixture();
    let bad_wakes = repoll_with_a_panicking_waker(&mut f, 0);
    let holder = f.holder.take();
    let task = catch_unwind(AssertUnwindSafe(move || {
        let _held = holder;
        panic!("the task holding the permit panics");
    }));
    assert!(task.is_err());
    assert_eq!(bad_wakes.wakes(), 1, "the unwind released the credit to a");
    head_takes_its_credit_then_serve(&mut f);
}

/// The trap springs where the sweep says: a first poll that panics leaves its future
/// unresolved (`Start`), and a later poll of the same future joins the line as usual.
#[test]
fn a_first_poll_that_panicked_can_be_polled_again() {
    let mut f = fixture();
    f.line.push(Waiter::new(&f.h, "c", 1));
    let c = f.line.len() - 1;
    assert_eq!(
        trapped(1, || f.line[c].poll().is_pending()),
        Err(E),
        "the enqueue's lookup panics"
    );
    assert!(!f.line[c].is_waiting());
    check_invariants(&f);
    assert!(f.line[c].poll().is_pending(), "joins on the next poll");
    check_invariants(&f);
    serve_to_the_end(&mut f);
}

/// With a sink set, the window clones the shard key for each credit's `Dispatched` event after
/// the credit is out, so the clone runs under `catch_unwind`: a `Clone` that panics there loses
/// that one event (counted as dropped) and nothing else, the caller is not unwound, and the
/// line is served to the end.
#[test]
fn with_events_on_a_clone_that_panics_for_an_event_loses_only_that_event() {
    let sinked = || {
        let f = fixture();
        f.h.set_event_sink(|_: &WindowEvent<TrapKey>| ());
        f
    };
    // A release hands its credit to `a`: the event's clone is the only user call.
    let mut f = sinked();
    arm(0);
    drop(f.holder.take());
    assert_eq!(disarm(), Some(C));
    assert_eq!(f.h.events_dropped(), 1);
    check_invariants(&f);
    serve_to_the_end(&mut f);

    // An idle entry's credit: the handle's hash and the lookup, then the event's clone.
    let mut f = sinked();
    arm(2);
    f.permits
        .push(f.h.try_acquire_owned(TrapKey(2)).expect("free"));
    assert_eq!(disarm(), Some(C));
    assert_eq!(f.h.events_dropped(), 1);
    check_invariants(&f);
    serve_to_the_end(&mut f);
}

std::thread_local!(static CLONE_PANICS: core::cell::Cell<bool> = const { core::cell::Cell::new(false) });

/// A hasher whose `Clone` panics while `CLONE_PANICS` is set: a stripe's window is made on
/// the stripe's first use with a clone of the handle's hasher, under the stripe's lock.
struct CloneTrap(TestHasher);

impl Clone for CloneTrap {
    fn clone(&self) -> Self {
        assert!(!CLONE_PANICS.with(|p| p.get()), "hasher clone trapped");
        CloneTrap(self.0.clone())
    }
}

impl core::hash::BuildHasher for CloneTrap {
    type Hasher = <TestHasher as core::hash::BuildHasher>::Hasher;
    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}

#[test]
fn a_hasher_clone_that_panics_making_a_stripe_leaves_it_unmade_and_the_handle_serving() {
    let cfg = WindowConfig::default().with_max_in_flight(1);
    let h =
        WindowHandle::<u32, CloneTrap>::with_hasher(cfg, CloneTrap(TestHasher::default())).unwrap();
    CLONE_PANICS.with(|p| p.set(true));
    let first = catch_unwind(AssertUnwindSafe(|| h.try_acquire(7).map(|_| ())));
    let owned = catch_unwind(AssertUnwindSafe(|| h.try_acquire_owned(7).map(|_| ())));
    CLONE_PANICS.with(|p| p.set(false));
    assert!(
        first.is_err() && owned.is_err(),
        "both first uses reached the clone"
    );
    // Nothing was taken: the stripe's window is made on the next use, with its one credit.
    let permit = h
        .try_acquire_owned(7)
        .expect("the stripe serves after the panic");
    assert_eq!((h.in_flight(&7), h.available(&7)), (1, 0));
    assert!(h.try_acquire(7).is_err(), "the one credit is held");
    drop(permit);
    assert_eq!((h.in_flight(&7), h.available(&7)), (0, 1));
    h.close();
    assert!(h.is_closed() && h.shared.is_drained());
}
