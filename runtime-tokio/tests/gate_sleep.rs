//! `GateSleep` under tokio's paused clock: it fires at the gate's deadline, re-arms when the
//! deadline moves earlier or later, survives losing `select!` races, and never spins.

use std::collections::hash_map::RandomState;
use std::time::Duration;

use throttle_tokio::write_gate::{TimerChange, WriteGate, WriteGateConfig};
use throttle_tokio::{GateSleep, Instant, Reason, Signal};

type Gate = WriteGate<u32, RandomState>;

/// An input to run on the gate at a given millisecond.
type Input = (u64, Box<dyn FnOnce(&mut Gate, Instant)>);

fn gate() -> Gate {
    WriteGate::new(WriteGateConfig::fluss_landed()).expect("the preset is valid")
}

/// What one run of the loop saw.
#[derive(Debug, Default)]
struct Seen {
    /// `(armed instant, tokio's now)` at each firing.
    fired: Vec<(Instant, Instant)>,
    /// Loop passes, to bound the work (no spinning).
    passes: u32,
}

/// A sender-shaped loop: `inputs[i] = (at, f)` runs `f` on the gate at `at` (a ticker arm
/// that competes with the timer arm every 10 ms); ends when the gate is empty after `until`.
async fn run(gate: &mut Gate, mut inputs: Vec<Input>) -> Seen {
    let mut sleep = GateSleep::starting_now();
    let mut seen = Seen::default();
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    inputs.reverse();
    sleep.update(gate.poll_timeout());
    loop {
        seen.passes += 1;
        assert!(seen.passes < 10_000, "the loop spins");
        tokio::select! {
            at = sleep.fired() => {
                let now = sleep.now();
                seen.fired.push((at, now));
                gate.handle_timeout(now);
            }
            _ = ticker.tick() => {
                let now = sleep.now();
                while inputs.last().is_some_and(|(t, _)| Instant::from_millis(*t) <= now) {
                    if let Some((_, f)) = inputs.pop() {
                        f(gate, now);
                    }
                }
                if inputs.is_empty() && gate.is_empty() {
                    break;
                }
            }
        }
        let _ = gate.poll_action();
        sleep.update(gate.poll_timeout());
    }
    seen
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn fires_at_the_gates_deadline_even_when_other_arms_keep_winning() {
    let mut g = gate();
    let seen = run(
        &mut g,
        vec![(
            0,
            Box::new(|g: &mut Gate, now| {
                // 3000 ms · 0.5² = 750 ms.
                g.handle_kv_signal(now, &1, Signal::Pressure(500_000));
            }),
        )],
    )
    .await;
    assert_eq!(
        seen.fired,
        [(Instant::from_millis(750), Instant::from_millis(750))]
    );
    // 76 ticks over 750 ms plus one firing: nothing else woke the loop.
    assert!(seen.passes <= 80, "{} passes", seen.passes);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn re_arms_when_the_deadline_moves_earlier_then_later() {
    let mut g = gate();
    let retry = Reason::RETRIABLE_WRITE;
    let seen = run(
        &mut g,
        vec![
            (
                0,
                Box::new(move |g: &mut Gate, now| {
                    g.handle_throttle(now, &1, retry, Duration::from_millis(900))
                        .unwrap();
                }),
            ),
            // Earlier: bucket 2 opens at 300 ms.
            (
                100,
                Box::new(move |g: &mut Gate, now| {
                    g.handle_throttle(now, &2, retry, Duration::from_millis(200))
                        .unwrap();
                }),
            ),
            // Earlier again, then forgotten: the deadline moves back later to 300 ms.
            (
                150,
                Box::new(move |g: &mut Gate, now| {
                    g.handle_throttle(now, &3, retry, Duration::from_millis(50))
                        .unwrap();
                }),
            ),
            (
                190,
                Box::new(|g: &mut Gate, _| {
                    assert!(g.forget(&3));
                }),
            ),
            // Later: bucket 1's table is dropped at 400 ms, so nothing fires at 900 ms.
            (400, Box::new(|g: &mut Gate, _| g.retain(|&b| b != 1))),
        ],
    )
    .await;
    assert_eq!(
        seen.fired,
        [(Instant::from_millis(300), Instant::from_millis(300))],
        "one firing, at bucket 2's opening: never at 200 ms (forgotten) or 900 ms (dropped)"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_timer_state_follows_poll_timeout_and_a_past_deadline_fires_once() {
    let mut g = gate();
    let mut sleep = GateSleep::starting_now();
    assert_eq!(sleep.update(g.poll_timeout()), TimerChange::Keep);
    let t0 = sleep.now();
    g.handle_kv_signal(t0, &1, Signal::Full);
    assert_eq!(
        sleep.update(g.poll_timeout()),
        TimerChange::Arm(Instant::from_millis(3_000))
    );
    assert_eq!(sleep.update(g.poll_timeout()), TimerChange::Keep);
    // Time passes beyond the deadline without the loop looking (a long batch encode).
    tokio::time::advance(Duration::from_millis(5_000)).await;
    let started = tokio::time::Instant::now();
    let at = sleep.fired().await;
    assert_eq!(at, Instant::from_millis(3_000));
    assert_eq!(
        tokio::time::Instant::now(),
        started,
        "a past deadline fires at once"
    );
    g.handle_timeout(sleep.now());
    assert_eq!(
        sleep.update(g.poll_timeout()),
        TimerChange::Keep,
        "fired, then disarmed"
    );
    // Disarmed: `fired` stays pending (a select! arm that never wins).
    let waited = tokio::time::timeout(Duration::from_secs(60), sleep.fired()).await;
    assert!(waited.is_err(), "a disarmed timer fired");
}
