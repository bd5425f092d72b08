//! tokio-only tests with paused time and auto-advance: the gate and the window driven by tokio's
//! own timers, without the scenario harness stepping time.

use core::time::Duration;

use throttle_tokio::sync::{GateHandle, WindowHandle};
use throttle_tokio::{GateState, Instant, Signal, TokioRuntime, WindowConfig, WriteGateConfig};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn gate_sleeper_auto_advances_to_the_exact_opening() {
    let rt = TokioRuntime::new();
    let gate: GateHandle<u32> =
        GateHandle::new(WriteGateConfig::fluss_issue_3454()).expect("the config is valid");
    gate.handle_kv_signal(rt.now(), &1, Signal::Pressure(500_000)); // 625 ms
    let state = gate.wait_until_open(&rt, &1).await;
    assert_eq!(
        (state, rt.now()),
        (GateState::Open, Instant::from_millis(625))
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn gate_sleeper_wakes_on_the_earlier_opening_set_by_another_task() {
    let rt = TokioRuntime::new();
    let gate: GateHandle<u32> =
        GateHandle::new(WriteGateConfig::fluss_issue_3454()).expect("the config is valid");
    gate.handle_kv_signal(rt.now(), &1, Signal::Full); // 5000 ms
    let (g, rt2) = (gate.clone(), rt.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        g.handle_kv_signal(rt2.now(), &1, Signal::Pressure(500_000)); // 100 + 625 ms
    });
    assert_eq!(gate.wait_until_open(&rt, &1).await, GateState::Open);
    assert_eq!(rt.now(), Instant::from_millis(725));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn window_permits_pace_tasks_on_tokio_timers_two_at_a_time() {
    let rt = TokioRuntime::new();
    let window: WindowHandle<u32> =
        WindowHandle::new(WindowConfig::default().with_max_in_flight(2)).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (w, rt2) = (window.clone(), rt.clone());
        tasks.push(tokio::spawn(async move {
            let permit = w.acquire(0).await.unwrap();
            assert!(w.in_flight(&0) <= 2);
            tokio::time::sleep(Duration::from_millis(10)).await;
            let done = rt2.now();
            drop(permit);
            done
        }));
    }
    let mut ends = Vec::new();
    for t in tasks {
        ends.push(t.await.unwrap());
    }
    ends.sort();
    let ms: Vec<u64> = ends.iter().map(|i| i.as_nanos() / 1_000_000).collect();
    assert_eq!(ms, [10, 10, 20, 20, 30, 30], "two at a time, 10 ms each");
}
