//! A few short cases on each runtime's real clock (tokio without paused time, async-std's
//! `AsyncStdRuntime`), generic over the core's `Runtime` alone.
//!
//! The manual-clock scenarios check the rules; these check that the adapters' real timers keep
//! them. Each case asserts a lower bound exactly: a wait never ends before its deadline, on the
//! runtime's clock and on std's monotonic clock measured from before the deadline was set. The
//! upper bound only turns a wait that never ends into a failure: it allows [`SLACK`] on top of
//! the deadline, for a loaded machine. Deadlines are tens of milliseconds.

use core::future::Future;
use core::time::Duration;
use std::sync::{Arc, Mutex};

use throttle_sansio::backpressure::Signal;
use throttle_sansio::conn_key::{ConnConfig, ConnKey};
use throttle_sansio::sync::{ConnPool, GateHandle, Runtime, WindowHandle};
use throttle_sansio::{GateState, Instant, WindowConfig, WriteGateConfig};

use crate::scenarios::Memory;

/// How late a wait may end (past its deadline) before the case fails.
const SLACK: Duration = Duration::from_millis(1_000);

const MS: Duration = Duration::from_millis(1);

/// 5000 ms × 0.2³: Fluss issue #3454's curve's delay for this pressure.
const PRESSURE_40_MS: Signal = Signal::Pressure(200_000);

/// Std's monotonic clock, read independently of the runtime's.
struct Wall(std::time::Instant);

impl Wall {
    fn start() -> Self {
        Wall(std::time::Instant::now())
    }

    /// Checks that at least `span` and at most `span + SLACK` have passed since `start`.
    fn assert_between(&self, span: Duration, what: &str) {
        let took = self.0.elapsed();
        assert!(
            took >= span,
            "{what}: ended after {took:?}, before {span:?}"
        );
        assert!(
            took <= span + SLACK,
            "{what}: took {took:?}, more than {span:?} + {SLACK:?}"
        );
    }
}

/// Sleeps in 1 ms steps on the runtime until `cond` holds; fails once `by` + [`SLACK`] passed.
async fn settle<R: Runtime>(rt: &R, what: &str, by: Instant, mut cond: impl FnMut() -> bool) {
    while !cond() {
        let now = rt.now();
        assert!(now <= by + SLACK, "never happened: {what}");
        rt.sleep_until(now + MS).await;
    }
}

/// Runs `f` on the runtime and returns the shared slot it fills.
fn spawn_into<R: Runtime, T: Send + 'static>(
    rt: &R,
    f: impl Future<Output = T> + Send + 'static,
) -> Arc<Mutex<Option<T>>> {
    let slot = Arc::new(Mutex::new(None));
    let out = Arc::clone(&slot);
    rt.spawn(async move {
        let v = f.await;
        *out.lock().unwrap() = Some(v);
    });
    slot
}

pub async fn concurrent_sleeps_never_end_before_their_deadlines<R: Runtime>(rt: &R) {
    let wall = Wall::start();
    let t0 = rt.now();
    let spans = [40 * MS, 10 * MS, 25 * MS];
    let woke: Vec<_> = spans
        .iter()
        .map(|&span| {
            let rt2 = rt.clone();
            spawn_into(rt, async move {
                rt2.sleep_until(t0 + span).await;
                (rt2.now(), std::time::Instant::now())
            })
        })
        .collect();
    let all_woke = || woke.iter().all(|w| w.lock().unwrap().is_some());
    settle(rt, "every sleep ended", t0 + 40 * MS, all_woke).await;
    for (span, w) in spans.iter().zip(&woke) {
        let (at, wall_at) = w.lock().unwrap().unwrap();
        assert!(
            at >= t0 + *span,
            "a {span:?} sleep ended on the runtime's clock at {at:?}"
        );
        let took = wall_at - wall.0;
        assert!(
            took >= *span && took <= *span + SLACK,
            "a {span:?} sleep took {took:?}"
        );
    }
}

pub async fn gate_opens_no_sooner_than_its_opening<R: Runtime>(rt: &R) {
    let gate = GateHandle::new(WriteGateConfig::fluss_issue_3454()).expect("the config is valid");
    let wall = Wall::start();
    let t0 = rt.now();
    let wait = gate.handle_kv_signal(t0, &7u32, PRESSURE_40_MS);
    assert_eq!(wait, 40 * MS);
    assert_eq!(gate.wait_until_open(rt, &7).await, GateState::Open);
    assert!(rt.now() >= t0 + wait, "opened at {:?}", rt.now());
    wall.assert_between(wait, "the gate's wait");
}

pub async fn gate_sleeper_rearms_on_the_real_timer_when_a_lower_pressure_arrives<R: Runtime>(
    rt: &R,
) {
    let gate = GateHandle::new(WriteGateConfig::fluss_issue_3454()).expect("the config is valid");
    let wall = Wall::start();
    let t0 = rt.now();
    assert_eq!(
        gate.handle_kv_signal(t0, &7u32, Signal::Full),
        5000 * MS,
        "issue #3454's ceiling"
    );
    // 20 ms in, another task lowers the pressure: the bucket now opens 40 ms after that.
    let (g, rt2) = (gate.clone(), rt.clone());
    let opening = spawn_into(rt, async move {
        rt2.sleep_until(t0 + 20 * MS).await;
        let t1 = rt2.now();
        t1 + g.handle_kv_signal(t1, &7, PRESSURE_40_MS)
    });
    assert_eq!(gate.wait_until_open(rt, &7).await, GateState::Open);
    let opened = rt.now();
    settle(rt, "the opening recorded", t0 + 60 * MS, || {
        opening.lock().unwrap().is_some()
    })
    .await;
    let opening = opening.lock().unwrap().unwrap();
    assert!(
        opened >= opening,
        "opened at {opened:?}, before the new opening {opening:?}"
    );
    // Well before the old opening at 5 s: the sleeper re-armed its timer on the Wake.
    wall.assert_between(60 * MS, "the re-armed wait");
}

pub async fn window_waiter_is_served_no_sooner_than_the_release<R: Runtime>(rt: &R) {
    let window = WindowHandle::new(WindowConfig::default().with_max_in_flight(1)).unwrap();
    let held = window.try_acquire_owned(7u32).unwrap();
    let wall = Wall::start();
    let t0 = rt.now();
    let rt2 = rt.clone();
    let released = spawn_into(rt, async move {
        rt2.sleep_until(t0 + 30 * MS).await;
        let at = rt2.now();
        drop(held);
        at
    });
    let permit = window.acquire(7).await.unwrap();
    let served = rt.now();
    // The release happened before the waiter was served, so its instant is already recorded
    // (or about to be: the releasing task writes it after the drop).
    settle(rt, "the release recorded", t0 + 30 * MS, || {
        released.lock().unwrap().is_some()
    })
    .await;
    let released = released.lock().unwrap().unwrap();
    assert!(served >= t0 + 30 * MS && served >= released);
    wall.assert_between(30 * MS, "the waiter's wait");
    drop(permit);
    assert_eq!(
        window.available(&7),
        1,
        "the credit was neither lost nor doubled"
    );
}

pub async fn idle_connection_closes_no_sooner_than_max_idle<R: Runtime>(rt: &R) {
    let counter = Arc::new(());
    let max_idle = 40 * MS;
    let cfg = ConnConfig::default().with_max_idle(max_idle);
    let pool: ConnPool<_, _, u32, u32> =
        ConnPool::new(rt.clone(), Memory(Arc::clone(&counter)), cfg).unwrap();
    let p = pool.clone();
    rt.spawn(async move { p.drive_timeouts().await });
    let key = ConnKey::new(0, 1, 9123);
    // The lower bound is checked only by a look before the deadline; a round in which the
    // first look came late (a stall of 40 ms) is run again.
    for _round in 0..3 {
        let lease = pool.lease(&key).await.unwrap();
        let (id, before_drop) = (lease.id(), rt.now());
        drop(lease);
        let deadline = pool.idle_deadline(id).expect("idle from the lease's end");
        assert!(
            deadline >= before_drop + max_idle,
            "idle deadline {deadline:?}"
        );
        let mut looked_early = false;
        loop {
            // The pool before the clock: if the clock is still short of the deadline, so was
            // it when the pool was read, and the connection must still be there.
            let len = pool.len();
            let now = rt.now();
            if now < deadline {
                assert_eq!(
                    len, 1,
                    "closed at {now:?}, before its idle deadline {deadline:?}"
                );
                looked_early = true;
            } else if len == 0 {
                break;
            }
            assert!(now <= deadline + SLACK, "still open at {now:?}");
            rt.sleep_until(now + MS).await;
        }
        settle(rt, "the connection dropped", deadline, || {
            Arc::strong_count(&counter) == 2
        })
        .await;
        if looked_early {
            return;
        }
    }
    panic!("no round looked at the pool before its idle deadline");
}
