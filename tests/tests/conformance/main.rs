//! One conformance suite for every runtime adapter, generic over the core's `Runtime`.
//!
//! Each scenario in `scenarios.rs` takes a [`Harness`]: a runtime plus a way to move its time.
//! tokio runs with paused time (`tokio::time::advance`); async-std runs on its own executor with
//! the core's `ManualClock` injected as the clock. No scenario reads the wall clock: time moves
//! only when a scenario advances it, and progress is awaited by condition, not by sleeping.
//!
//! The cases in `real_clock.rs` run on each adapter's own runtime as shipped, real clock and
//! timers (tokio without paused time, `AsyncStdRuntime`): a few short waits (tens of ms) whose
//! lower bound is asserted exactly, with a second of slack above.

mod harness;
mod real_clock;
mod scenarios;

use harness::{AsyncStdManual, Harness, TokioPaused};

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod on_tokio {
            $(
                #[tokio::test(flavor = "current_thread", start_paused = true)]
                async fn $name() {
                    crate::scenarios::$name(&crate::TokioPaused::new()).await;
                }
            )*
        }
        mod on_async_std {
            $(
                #[test]
                fn $name() {
                    async_std::task::block_on(crate::scenarios::$name(&crate::AsyncStdManual::new()));
                }
            )*
        }
    };
}

conformance!(
    window_of_two_serves_five_submitters_in_arrival_order_never_more_than_two_at_once,
    cancelled_waiter_leaves_the_line_and_the_next_one_gets_the_credit,
    close_fails_waiters_and_held_batches_while_batches_in_flight_finish,
    gate_opens_early_when_a_lower_pressure_arrives,
    idle_connection_is_closed_after_max_idle,
    eight_concurrent_failures_share_one_refresh,
);

macro_rules! real_clock {
    ($($name:ident),* $(,)?) => {
        mod on_tokio_real_clock {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $name() {
                    crate::real_clock::$name(&throttle_tokio::TokioRuntime::new()).await;
                }
            )*
        }
        mod on_async_std_real_clock {
            $(
                #[test]
                fn $name() {
                    let rt = throttle_async_std::AsyncStdRuntime::new();
                    async_std::task::block_on(crate::real_clock::$name(&rt));
                }
            )*
        }
    };
}

real_clock!(
    concurrent_sleeps_never_end_before_their_deadlines,
    gate_opens_no_sooner_than_its_opening,
    gate_sleeper_rearms_on_the_real_timer_when_a_lower_pressure_arrives,
    window_waiter_is_served_no_sooner_than_the_release,
    idle_connection_closes_no_sooner_than_max_idle,
);

// Keep the trait in use for both harnesses even if a scenario list shrinks.
#[allow(dead_code)]
fn _harnesses_implement_the_trait() {
    fn is<H: Harness>() {}
    is::<TokioPaused>();
    is::<AsyncStdManual>();
}
