//! The gate handle when user code panics (issue 12): the closure passed to
//! [`GateHandle::update`], a bucket key whose `Hash`, `Eq` or `Clone` panics at each of its
//! calls in turn, and wakers that panic. After every panic the handle must still serve, the
//! gate's invariants hold, its `Wake`s reach the sleepers and its timer loop is re-armed.

use alloc::boxed::Box;
use alloc::format;
use alloc::vec::Vec;
use core::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::*;
use crate::rng::SplitMix64;
use crate::sync::panic_support::{PanickingWaker, Point, TrapKey, sweep};
use crate::sync::test_support::{CountingWaker, Executor, TestRuntime, poll_once};
use crate::test_hasher::TestHasher;

type Gate = GateHandle<u32, TestHasher>;
type TrapGate = GateHandle<TrapKey, TestHasher>;

fn gate<K: Hash + Eq + Clone>() -> GateHandle<K, TestHasher> {
    match GateHandle::with_hasher(WriteGateConfig::fluss_issue_3454(), TestHasher::default()) {
        Ok(g) => g,
        Err(e) => panic!("the default config is valid: {e}"),
    }
}

fn assert_consistent<K: Hash + Eq + Clone>(g: &GateHandle<K, TestHasher>) {
    assert_eq!(g.update(|g| g.check_invariants()), Ok(()));
}

/// A closure that applies an input and then panics: the caller sees the panic, and what the
/// input did is followed through as if the closure had returned.
fn update_then_panic(g: &Gate, input: impl FnOnce(&mut WriteGate<u32, TestHasher>)) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        g.update(|g| {
            input(g);
            panic!("the update closure panics");
        })
    }));
    assert!(outcome.is_err(), "the panic reaches the caller of update");
}

#[test]
fn a_wake_emitted_before_the_update_closure_panicked_still_reaches_the_sleepers() {
    let mut ex = Executor::default();
    let mut rt = TestRuntime::new();
    rt.spawner = Some(ex.spawner());
    let g = gate::<u32>();
    let t0 = Instant::ZERO;
    let _ = g.handle_kv_signal(t0, &7, Signal::Full); // 5000 ms
    {
        let (g, rt2) = (g.clone(), rt.clone());
        rt.spawn(async move {
            let _ = g.wait_until_open(&rt2, &7).await;
        });
    }
    assert_eq!(ex.run_until_stalled(), 1);
    assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(5000)));
    let epoch = g.signal().epoch();
    // Half pressure shortens the throttle to 625 ms and emits a Wake; then the closure panics.
    update_then_panic(&g, |g| {
        let _ = g.handle_kv_signal(t0, &7, Signal::Pressure(500_000));
    });
    assert!(
        g.signal().has_changed(epoch),
        "the Wake notified the signal"
    );
    assert_eq!(ex.run_until_stalled(), 1);
    assert_eq!(
        rt.clock.next_deadline(),
        Some(Instant::from_millis(625)),
        "the sleeper re-armed at the earlier opening"
    );
    assert_consistent(&g);
    rt.clock.advance_to(Instant::from_millis(625));
    assert_eq!(ex.run_until_stalled(), 0, "and opens there");
}

#[test]
fn a_deadline_moved_earlier_before_the_update_closure_panicked_re_arms_the_timer_loop() {
    let mut ex = Executor::default();
    let mut rt = TestRuntime::new();
    rt.spawner = Some(ex.spawner());
    let g = gate::<u32>();
    {
        let (g, rt2) = (g.clone(), rt.clone());
        rt.spawn(async move { g.drive_timeouts(&rt2).await });
    }
    assert_eq!(ex.run_until_stalled(), 1);
    assert_eq!(rt.clock.next_deadline(), Some(Instant::MAX), "idle: asleep");
    update_then_panic(&g, |g| {
        let _ = g.handle_kv_signal(Instant::ZERO, &1, Signal::Full);
    });
    assert_eq!(ex.run_until_stalled(), 1);
    assert_eq!(
        rt.clock.next_deadline(),
        Some(Instant::from_millis(5000)),
        "the timer loop re-armed at the new deadline"
    );
    rt.clock.advance_to(Instant::from_millis(5000));
    assert_eq!(ex.run_until_stalled(), 1);
    assert!(g.update(|g| g.is_empty()), "and evicted the expired gate");
    assert_consistent(&g);
}

#[test]
fn a_panicking_sleeper_waker_does_not_keep_the_others_asleep() {
    let g = gate::<u32>();
    let rt = TestRuntime::new();
    let _ = g.handle_kv_signal(Instant::ZERO, &7, Signal::Full);
    let (bad, bad_wakes) = PanickingWaker::new();
    let (good, good_wakes) = CountingWaker::new();
    let mut first = Box::pin(g.wait_until_open(&rt, &7));
    let mut second = Box::pin(g.wait_until_open(&rt, &7));
    assert!(poll_once(&mut first, &bad).is_pending());
    assert!(poll_once(&mut second, &good).is_pending());
    let shortened = catch_unwind(AssertUnwindSafe(|| {
        g.handle_kv_signal(Instant::ZERO, &7, Signal::Pressure(500_000))
    }));
    assert_eq!(
        shortened.ok(),
        Some(Duration::from_millis(625)),
        "the input returns normally"
    );
    assert!(
        bad_wakes.wakes() >= 1 && good_wakes.wakes() >= 1,
        "both woken"
    );
    assert!(poll_once(&mut second, &good).is_pending());
    assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(625)));
}

/// A gate of at most three buckets (so its index never grows during an operation): bucket 1
/// gated at full pressure, bucket 2 with an unknown leader, bucket 3 new.
fn trap_fixture() -> TrapGate {
    let g = gate::<TrapKey>();
    let _ = g.handle_kv_signal(Instant::ZERO, &TrapKey(1), Signal::Full);
    g.handle_leader(Instant::ZERO, &TrapKey(2), false);
    g
}

/// After `what`, panicked at `point` or not: the gate is consistent, serves every bucket, and
/// returns to empty once every throttle expired and the leaders are known.
fn check_trap_gate(g: &TrapGate, what: &str, point: Option<Point>) {
    let consistent = |when: &str| {
        assert_eq!(
            g.update(|g| g.check_invariants()),
            Ok(()),
            "{what}, panicked at {point:?}: {when}"
        );
    };
    consistent("right after");
    let t = Instant::from_millis(1);
    for b in [1, 2, 3] {
        let _ = g.check(t, &TrapKey(b));
        let _ = g.handle_kv_signal(t, &TrapKey(b), Signal::Pressure(500_000));
        consistent("after later inputs");
    }
    let end = Instant::from_millis(3_600_000);
    for b in [1, 2, 3] {
        g.handle_leader(end, &TrapKey(b), true);
    }
    g.update(|g| g.handle_timeout(end));
    consistent("after every throttle expired");
    assert_eq!(
        g.update(|g| g.len()),
        0,
        "{what}, panicked at {point:?}: every bucket evicted"
    );
}

fn sweep_gate(what: &str, mut op: impl FnMut(&TrapGate)) -> Vec<Point> {
    sweep(
        trap_fixture,
        |g| op(g),
        |g, point| check_trap_gate(g, what, point),
    )
}

#[test]
fn gate_inputs_and_queries_survive_a_panic_at_each_key_call() {
    let t = Instant::ZERO;
    let mut rng = SplitMix64::new(1);
    for bucket in [1, 2, 3] {
        let k = TrapKey(bucket);
        let reached = [
            sweep_gate(&format!("kv signal, bucket {bucket}"), |g| {
                let _ = g.handle_kv_signal(t, &k, Signal::Pressure(500_000));
            }),
            sweep_gate(&format!("disk write locked, bucket {bucket}"), |g| {
                let _ = g.handle_disk_write_locked(t, &k, 0, &mut rng);
            }),
            sweep_gate(&format!("success, bucket {bucket}"), |g| {
                g.handle_success(t, &k)
            }),
            sweep_gate(&format!("check and remaining, bucket {bucket}"), |g| {
                let _ = (g.check(t, &k), g.remaining(t, &k));
            }),
            sweep_gate(&format!("retriable write, bucket {bucket}"), |g| {
                let _ = g.handle_retriable_write(t, &k, 1, &mut rng);
            }),
            sweep_gate(&format!("throttle, bucket {bucket}"), |g| {
                let delay = Duration::from_millis(100);
                let _ = g.handle_throttle(t, &k, Reason::KV_BACKPRESSURE, delay);
            }),
            sweep_gate(&format!("send, bucket {bucket}"), |g| g.handle_send(t, &k)),
            // The bound form runs the same inputs through the same `update`.
            sweep_gate(&format!("bound kv signal, bucket {bucket}"), |g| {
                let bound = g.clone().bind(TestRuntime::new());
                let _ = bound.handle_kv_signal(&k, Signal::Pressure(500_000));
            }),
            sweep_gate(&format!("bound disk write locked, bucket {bucket}"), |g| {
                let bound = g.clone().bind(TestRuntime::new());
                let _ = bound.handle_disk_write_locked(&k, 0);
            }),
            sweep_gate(
                &format!("bound check and remaining, bucket {bucket}"),
                |g| {
                    let bound = g.clone().bind(TestRuntime::new());
                    let _ = (bound.check(&k), bound.remaining(&k));
                },
            ),
        ];
        assert!(
            reached.iter().all(|points| !points.is_empty()),
            "bucket {bucket}: every input reached the key's code: {reached:?}"
        );
    }
}

/// Found here, fixed in the core `WriteGate`: `handle_leader` used to hash the key a second time
/// (`set_leader_unknown`) after it had changed the bucket (dropped its leader-scoped deadlines,
/// or cleaned them), so a `Hash` that panicked there left the map inconsistent ("an idle bucket
/// was not evicted"). The gate now stores each slot's hash and runs key code only first.
#[test]
fn leader_changes_survive_a_panic_at_each_key_call() {
    let t = Instant::ZERO;
    for bucket in [1, 2, 3] {
        let k = TrapKey(bucket);
        let reached = [
            sweep_gate(&format!("leader unknown, bucket {bucket}"), |g| {
                g.handle_leader(t, &k, false)
            }),
            sweep_gate(&format!("leader known, bucket {bucket}"), |g| {
                g.handle_leader(t, &k, true)
            }),
        ];
        assert!(
            reached.iter().all(|points| !points.is_empty()),
            "bucket {bucket}: every input reached the key's code: {reached:?}"
        );
    }
}

#[test]
fn a_sleeper_whose_key_panics_leaves_no_timer_or_listener_behind() {
    let g = gate::<TrapKey>();
    let rt = TestRuntime::new();
    let _ = g.handle_kv_signal(Instant::ZERO, &TrapKey(1), Signal::Full);
    let (w, _) = CountingWaker::new();
    let key = TrapKey(1);
    let mut sleeper = Box::pin(g.wait_until_open(&rt, &key));
    assert!(poll_once(&mut sleeper, &w).is_pending());
    assert_eq!((rt.clock.sleepers(), g.signal().listeners()), (1, 1));
    g.signal().notify(); // the sleeper looks again, and its key's `Hash` panics there
    let polled =
        crate::sync::panic_support::trapped(0, || poll_once(&mut sleeper, &w).is_pending());
    assert_eq!(polled, Err(Point::Hash));
    drop(sleeper);
    assert_eq!(
        (rt.clock.sleepers(), g.signal().listeners()),
        (0, 0),
        "its timer and listener are gone with it"
    );
    assert_consistent(&g);
    assert_eq!(
        g.remaining(Instant::ZERO, &TrapKey(1)),
        Duration::from_millis(5000)
    );
}

use crate::rng::PanickingRng;

#[test]
fn a_drawing_input_whose_rng_panics_leaves_the_gate_as_it_was() {
    let g = gate::<u32>();
    let mut rng = SplitMix64::new(3);
    let _ = g.handle_disk_write_locked(Instant::ZERO, &1, 0, &mut rng);
    let snapshot = || g.update(|g| format!("{g:?}"));
    for bucket in [1, 2] {
        let before = snapshot();
        let at = Instant::from_millis(50);
        let disk = catch_unwind(AssertUnwindSafe(|| {
            g.handle_disk_write_locked(at, &bucket, 3, &mut PanickingRng)
        }));
        let retry = catch_unwind(AssertUnwindSafe(|| {
            g.handle_retriable_write(at, &bucket, 3, &mut PanickingRng)
        }));
        assert!(
            disk.is_err() && retry.is_err(),
            "the panic reaches the caller"
        );
        assert_eq!(
            snapshot(),
            before,
            "bucket {bucket}: the input did not happen"
        );
        assert_consistent(&g);
    }
    assert!(g.handle_disk_write_locked(Instant::ZERO, &2, 0, &mut rng) > Duration::ZERO);
}

/// A runtime whose clock panics, standing in for a user `Runtime` that fails.
#[derive(Clone)]
struct PanickingClock;

impl Runtime for PanickingClock {
    fn now(&self) -> Instant {
        panic!("the runtime's clock panics")
    }
    fn sleep_until(&self, _: Instant) -> impl Future<Output = ()> + Send + 'static {
        core::future::ready(())
    }
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
        drop(future);
    }
}

#[test]
fn a_bound_input_whose_runtime_clock_panics_changes_nothing() {
    let g = gate::<u32>();
    let _ = g.handle_kv_signal(Instant::ZERO, &1, Signal::Full);
    let before = g.update(|g| format!("{g:?}"));
    let bound = g.clone().bind(PanickingClock);
    let epoch = g.signal().epoch();
    let calls: [&dyn Fn(); 3] = [
        &|| {
            let _ = bound.handle_kv_signal(&1, Signal::Pressure(500_000));
        },
        &|| {
            let _ = bound.handle_disk_write_locked(&2, 0);
        },
        &|| {
            let _ = bound.check(&1);
        },
    ];
    for call in calls {
        assert!(catch_unwind(AssertUnwindSafe(call)).is_err());
    }
    assert_eq!(g.update(|g| format!("{g:?}")), before);
    assert!(!g.signal().has_changed(epoch), "nothing notified");
    assert_consistent(&g);
    let _ = g.handle_kv_signal(Instant::ZERO, &1, Signal::Pressure(500_000));
}

#[test]
fn a_wake_emitted_before_the_update_drawing_closure_panicked_still_notifies() {
    let rt = TestRuntime::new();
    let g = gate::<u32>().bind(rt.clone());
    let _ = g.handle_kv_signal(&7, Signal::Full); // 5000 ms
    let epoch = g.signal().epoch();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        g.update_drawing(|g, rng| {
            // Half pressure shortens the throttle and emits a Wake; the draw is the closure's.
            let _ = g.handle_kv_signal(Instant::ZERO, &7, Signal::Pressure(500_000));
            let _ = crate::rng::below(rng, 10);
            panic!("the update closure panics");
        })
    }));
    assert!(outcome.is_err(), "the panic reaches the caller");
    assert!(
        g.signal().has_changed(epoch),
        "the Wake notified the signal"
    );
    assert_eq!(
        g.remaining(&7),
        Duration::from_millis(625),
        "what it did stays done"
    );
    assert_eq!(g.update(|g| g.check_invariants()), Ok(()));
}
