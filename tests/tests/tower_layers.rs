//! The tower layers (`throttle_sansio::sync::tower`, feature `tower`) driven with tower-test's
//! mock service on tokio with paused time: the keyed concurrency limit never exceeds its
//! window and gives each credit back exactly once (answer, error, cancellation, panic), and the
//! write-gate layer holds requests while their bucket is gated, wakes early, and feeds every
//! answer back into the gate.

use core::time::Duration;
use std::task::Poll;

use throttle_sansio::paced_writer::WriteOutcome;
use throttle_sansio::sync::tower::{
    KeyedConcurrency, KeyedConcurrencyLayer, LayerError, WriteGateLayer, WriteGateService,
};
use throttle_sansio::sync::{GateHandle, WindowHandle};
use throttle_sansio::write_gate::{OutcomeFeed, Reason};
use throttle_sansio::{Instant, Signal, WindowConfig, WriteGateConfig};
use throttle_tokio::TokioRuntime;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_test::mock;

#[derive(Clone, Debug, PartialEq)]
struct Req {
    shard: u32,
    id: u32,
}

fn req(shard: u32, id: u32) -> Req {
    Req { shard, id }
}

/// Lets every spawned task run until it blocks (paused time does not move while tasks run).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn window(n: usize) -> WindowHandle<u32> {
    WindowHandle::new(WindowConfig::default().with_max_in_flight(n)).unwrap()
}

type Mock = mock::Mock<Req, u32>;
type MockHandle = mock::Handle<Req, u32>;

fn shard_of(r: &Req) -> u32 {
    r.shard
}

type ShardOf = fn(&Req) -> u32;
type Limited = KeyedConcurrency<Mock, u32, ShardOf>;

fn limited(n: usize) -> (WindowHandle<u32>, Limited, MockHandle) {
    let window = window(n);
    let (svc, handle): (Mock, MockHandle) = mock::pair();
    let svc = KeyedConcurrencyLayer::new(window.clone(), shard_of as ShardOf).layer(svc);
    (window, svc, handle)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn concurrency_never_exceeds_the_window_and_serves_the_line_in_order() {
    let (window, svc, mut handle) = limited(2);
    let mut calls = Vec::new();
    for id in 0..5 {
        calls.push(tokio::spawn(svc.clone().oneshot(req(1, id))));
    }
    let mut served = Vec::new();
    for _ in 0..5 {
        settle().await;
        assert!(
            window.in_flight(&1) <= 2,
            "{} in flight",
            window.in_flight(&1)
        );
        let (r, reply) = handle.next_request().await.expect("a request");
        assert!(window.in_flight(&1) <= 2);
        served.push(r.id);
        // Only the requests holding a credit reached the service.
        settle().await;
        assert_eq!(window.in_flight(&1) as usize, (5 - served.len()).min(1) + 1);
        reply.send_response(r.id * 10);
    }
    assert_eq!(served, [0, 1, 2, 3, 4], "FIFO within the shard");
    for (id, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().unwrap(), id as u32 * 10);
    }
    assert_eq!((window.in_flight(&1), window.waiting(&1)), (0, 0));
    assert_eq!(window.available(&1), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_inner_service_never_sees_more_than_the_window_of_one_shard() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, p) = (Arc::clone(&now), Arc::clone(&peak));
    let inner = tower::service_fn(move |r: Req| {
        let (n, p) = (Arc::clone(&n), Arc::clone(&p));
        async move {
            let inside = n.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(inside, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            n.fetch_sub(1, Ordering::SeqCst);
            Ok::<u32, tower::BoxError>(r.id)
        }
    });
    let window = window(2);
    let svc = KeyedConcurrencyLayer::new(window.clone(), shard_of as ShardOf).layer(inner);
    let start = tokio::time::Instant::now();
    let calls: Vec<_> = (0..6)
        .map(|id| tokio::spawn(svc.clone().oneshot(req(1, id))))
        .collect();
    for (id, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().unwrap(), id as u32);
    }
    assert_eq!(peak.load(Ordering::SeqCst), 2, "two at a time, never more");
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(30),
        "and never fewer"
    );
    assert_eq!(window.in_flight(&1), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_exhausted_shard_never_blocks_another_shard() {
    let (window, svc, mut handle) = limited(1);
    let _a = tokio::spawn(svc.clone().oneshot(req(1, 0)));
    let _b = tokio::spawn(svc.clone().oneshot(req(1, 1)));
    settle().await;
    let (first, _hold) = handle.next_request().await.unwrap();
    assert_eq!(first.id, 0);
    assert_eq!((window.in_flight(&1), window.waiting(&1)), (1, 1));
    // Shard 1 is exhausted; shard 2's request goes straight through.
    let other = tokio::spawn(svc.clone().oneshot(req(2, 7)));
    settle().await;
    let (r, reply) = handle.next_request().await.unwrap();
    assert_eq!(r, req(2, 7));
    reply.send_response(70);
    assert_eq!(other.await.unwrap().unwrap(), 70);
    assert_eq!(
        window.waiting(&1),
        1,
        "shard 1's second request still waits"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_credit_comes_back_once_on_error_cancellation_and_close() {
    let (window, mut svc, mut handle) = limited(2);

    // An error answer gives the credit back.
    let call = tokio::spawn(svc.clone().oneshot(req(1, 0)));
    let (_, reply) = handle.next_request().await.unwrap();
    assert_eq!(window.in_flight(&1), 1);
    reply.send_error("boom");
    assert!(matches!(call.await.unwrap(), Err(LayerError::Inner(_))));
    assert_eq!(window.in_flight(&1), 0);

    // Dropped while on the wire.
    let mut fut = svc.ready().await.unwrap().call(req(1, 1));
    assert!(futures_poll(&mut fut).is_pending());
    let (_, _reply) = handle.next_request().await.unwrap();
    assert_eq!(window.in_flight(&1), 1);
    drop(fut);
    assert_eq!(
        window.in_flight(&1),
        0,
        "the credit came back when the future was dropped"
    );

    // Dropped while waiting in line.
    let holders: Vec<_> = (0..2)
        .map(|id| tokio::spawn(svc.clone().oneshot(req(1, 10 + id))))
        .collect();
    settle().await;
    let mut replies = Vec::new();
    for _ in 0..2 {
        replies.push(handle.next_request().await.unwrap().1);
    }
    let mut waiting = svc.ready().await.unwrap().call(req(1, 99));
    assert!(futures_poll(&mut waiting).is_pending());
    assert_eq!(window.waiting(&1), 1);
    drop(waiting);
    assert_eq!(window.waiting(&1), 0);
    for reply in replies {
        reply.send_response(0);
    }
    for h in holders {
        h.await.unwrap().unwrap();
    }
    // Exactly once: neither lost nor given back twice.
    assert_eq!((window.in_flight(&1), window.available(&1)), (0, 2));

    // Close fails the waiters and later requests; nothing reaches the service.
    let _a = svc.clone().oneshot(req(3, 0));
    let held = tokio::spawn(svc.clone().oneshot(req(3, 1)));
    let held2 = tokio::spawn(svc.clone().oneshot(req(3, 2)));
    let queued = tokio::spawn(svc.clone().oneshot(req(3, 3)));
    settle().await;
    let (_, r1) = handle.next_request().await.unwrap();
    let (_, r2) = handle.next_request().await.unwrap();
    assert_eq!(window.waiting(&3), 1);
    window.close();
    assert!(matches!(queued.await.unwrap(), Err(LayerError::Closed)));
    r1.send_response(1);
    r2.send_response(2);
    assert_eq!(
        held.await.unwrap().unwrap() + held2.await.unwrap().unwrap(),
        3
    );
    assert!(matches!(
        svc.clone().oneshot(req(3, 4)).await,
        Err(LayerError::Closed)
    ));
    assert_eq!(window.in_flight(&3), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_panicking_key_or_inner_service_fails_only_its_request() {
    let window = window(1);
    let (inner, mut handle): (Mock, MockHandle) = mock::pair();
    let layer = KeyedConcurrencyLayer::new(window.clone(), |r: &Req| {
        assert!(r.id != 13, "a key extractor that panics");
        r.shard
    });
    let svc = layer.layer(inner);
    assert!(matches!(
        svc.clone().oneshot(req(1, 13)).await,
        Err(LayerError::Panicked)
    ));
    assert_eq!(window.in_flight(&1), 0);

    // An inner service whose future panics: the credit comes back, the next request goes.
    let panicky = tower::service_fn(|r: Req| async move {
        assert!(r.id != 7, "an inner future that panics");
        Ok::<u32, tower::BoxError>(r.id)
    });
    let svc2 = KeyedConcurrencyLayer::new(window.clone(), |r: &Req| r.shard).layer(panicky);
    assert!(matches!(
        svc2.clone().oneshot(req(1, 7)).await,
        Err(LayerError::Panicked)
    ));
    assert_eq!(window.in_flight(&1), 0);
    assert_eq!(svc2.oneshot(req(1, 8)).await.unwrap(), 8);

    // The first service is still whole.
    let call = tokio::spawn(svc.oneshot(req(1, 1)));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(5);
    assert_eq!(call.await.unwrap().unwrap(), 5);
}

/// Polls `fut` once with a no-op waker.
fn futures_poll<F: core::future::Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    core::pin::Pin::new(fut).poll(&mut cx)
}

// ------------------------------------------------------------------------ write gate

/// The server's answer in these tests: 0 written (with pressure in ppm), 1 disk locked,
/// 2 storage backpressure, 3 retriable, else fatal.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Answer {
    code: u8,
    pressure_ppm: u32,
}

const WRITTEN: Answer = Answer {
    code: 0,
    pressure_ppm: 0,
};

fn classify(a: &Answer) -> WriteOutcome {
    match a.code {
        0 if a.pressure_ppm == 0 => WriteOutcome::Ok {
            pressure: Signal::Clear,
        },
        0 => WriteOutcome::Ok {
            pressure: Signal::Pressure(a.pressure_ppm),
        },
        1 => WriteOutcome::DiskWriteLocked,
        2 => WriteOutcome::StorageBackpressure,
        3 => WriteOutcome::Retriable,
        _ => WriteOutcome::Fatal,
    }
}

type Gate = GateHandle<u32, std::hash::RandomState, TokioRuntime>;

fn gate() -> Gate {
    GateHandle::with_runtime(TokioRuntime::new(), WriteGateConfig::fluss_issue_3454()).unwrap()
}

type Classify = fn(&Answer) -> WriteOutcome;
type Gated = WriteGateService<
    mock::Mock<Req, Answer>,
    u32,
    std::hash::RandomState,
    TokioRuntime,
    ShardOf,
    Classify,
>;

fn gated(gate: &Gate) -> (Gated, mock::Handle<Req, Answer>) {
    let (inner, handle) = mock::pair::<Req, Answer>();
    let layer = WriteGateLayer::new(gate.clone(), shard_of as ShardOf, classify as Classify);
    (layer.layer(inner), handle)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_gated_bucket_holds_its_requests_until_the_gate_opens_and_others_go() {
    let gate = gate();
    let rt = gate.runtime().clone();
    let (svc, mut handle) = gated(&gate);
    gate.handle_kv_signal(&1, Signal::Pressure(500_000)); // 625 ms
    let held = tokio::spawn(svc.clone().oneshot(req(1, 0)));
    let free = tokio::spawn(svc.clone().oneshot(req(2, 0)));
    let (r, reply) = handle.next_request().await.unwrap();
    assert_eq!(
        (r.shard, rt.now()),
        (2, Instant::from_millis(0)),
        "bucket 2 is open"
    );
    reply.send_response(WRITTEN);
    assert_eq!(free.await.unwrap().unwrap(), WRITTEN);
    let (r, reply) = handle.next_request().await.unwrap();
    assert_eq!(
        (r.shard, rt.now()),
        (1, Instant::from_millis(625)),
        "sent at the opening"
    );
    reply.send_response(WRITTEN);
    held.await.unwrap().unwrap();
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiting_request_wakes_early_when_the_opening_moves_earlier() {
    let gate = gate();
    let rt = gate.runtime().clone();
    let (svc, mut handle) = gated(&gate);
    gate.handle_kv_signal(&1, Signal::Full); // 5000 ms
    let call = tokio::spawn(svc.oneshot(req(1, 0)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.handle_kv_signal(&1, Signal::Pressure(500_000)); // 100 + 625 ms
    let (_, reply) = handle.next_request().await.unwrap();
    assert_eq!(rt.now(), Instant::from_millis(725));
    reply.send_response(WRITTEN);
    call.await.unwrap().unwrap();
}

/// Sends one request on bucket 1 through `svc` and answers it with `a`.
async fn answer(
    svc: &Gated,
    handle: &mut mock::Handle<Req, Answer>,
    a: Answer,
) -> Result<Answer, LayerError<tower::BoxError>> {
    let call = tokio::spawn(svc.clone().oneshot(req(1, 0)));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(a);
    call.await.unwrap()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_answer_is_fed_back_into_the_gate_by_the_writers_rule() {
    let gate = gate();
    let (svc, mut handle) = gated(&gate);
    // Written with pressure: the KV curve's delay for it (625 ms at 0.5).
    answer(
        &svc,
        &mut handle,
        Answer {
            code: 0,
            pressure_ppm: 500_000,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        gate.explain(&1).map(|(r, _)| r),
        Some(Reason::KV_BACKPRESSURE)
    );
    assert_eq!(gate.remaining(&1), Duration::from_millis(625));
    // A request sent now waits out the 625 ms, then a disk rejection backs the bucket off.
    let rt = gate.runtime().clone();
    answer(
        &svc,
        &mut handle,
        Answer {
            code: 1,
            pressure_ppm: 0,
        },
    )
    .await
    .unwrap();
    assert_eq!(rt.now(), Instant::from_millis(625));
    let (reason, until) = gate.explain(&1).expect("gated");
    assert_eq!(reason, Reason::DISK_WRITE_LOCKED);
    assert!(until > rt.now());

    // Fatal answers and transport errors teach the gate nothing.
    let other =
        GateHandle::with_runtime(TokioRuntime::new(), WriteGateConfig::fluss_issue_3454()).unwrap();
    let (svc, mut h) = gated(&other);
    let call = tokio::spawn(svc.clone().oneshot(req(5, 0)));
    let (_, reply) = h.next_request().await.unwrap();
    reply.send_response(Answer {
        code: 9,
        pressure_ppm: 0,
    });
    call.await.unwrap().unwrap();
    let call = tokio::spawn(svc.oneshot(req(5, 1)));
    let (_, reply) = h.next_request().await.unwrap();
    reply.send_error("connection reset");
    assert!(matches!(call.await.unwrap(), Err(LayerError::Inner(_))));
    assert_eq!(other.explain(&5), None);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_feed_switches_match_the_paced_writers() {
    let gate = gate();
    let (inner, mut handle) = mock::pair::<Req, Answer>();
    let off = OutcomeFeed {
        disk_backoff: false,
        kv_pressure: false,
    };
    let svc = WriteGateLayer::new(gate.clone(), |r: &Req| r.shard, classify)
        .with_feed(off)
        .layer(inner);
    for code in [1, 0] {
        let call = tokio::spawn(svc.clone().oneshot(req(1, 0)));
        let (_, reply) = handle.next_request().await.unwrap();
        reply.send_response(Answer {
            code,
            pressure_ppm: 900_000,
        });
        call.await.unwrap().unwrap();
        assert_eq!(
            gate.explain(&1),
            None,
            "code {code} fed nothing with both switches off"
        );
    }
    // Storage backpressure without the KV feed is an ordinary retriable error.
    let call = tokio::spawn(svc.oneshot(req(1, 0)));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(Answer {
        code: 2,
        pressure_ppm: 0,
    });
    call.await.unwrap().unwrap();
    assert_eq!(
        gate.explain(&1).map(|(r, _)| r),
        Some(Reason::RETRIABLE_WRITE)
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_panicking_classifier_fails_its_request_and_the_gate_is_unchanged() {
    let gate = gate();
    let (inner, mut handle) = mock::pair::<Req, Answer>();
    let svc = WriteGateLayer::new(
        gate.clone(),
        |r: &Req| r.shard,
        |a: &Answer| {
            assert!(a.code != 7, "a classifier that panics");
            classify(a)
        },
    )
    .layer(inner);
    let call = tokio::spawn(svc.clone().oneshot(req(1, 0)));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(Answer {
        code: 7,
        pressure_ppm: 0,
    });
    assert!(matches!(call.await.unwrap(), Err(LayerError::Panicked)));
    assert_eq!(gate.explain(&1), None);
    let call = tokio::spawn(svc.oneshot(req(1, 1)));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(Answer {
        code: 1,
        pressure_ppm: 0,
    });
    call.await.unwrap().unwrap();
    assert_eq!(
        gate.explain(&1).map(|(r, _)| r),
        Some(Reason::DISK_WRITE_LOCKED)
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn stacked_with_service_builder_a_gated_request_holds_no_credit() {
    let gate = gate();
    let window = window(1);
    let (inner, mut handle) = mock::pair::<Req, Answer>();
    let svc = ServiceBuilder::new()
        .layer(WriteGateLayer::new(
            gate.clone(),
            |r: &Req| r.shard,
            classify,
        ))
        .layer(KeyedConcurrencyLayer::new(window.clone(), |r: &Req| {
            r.shard
        }))
        .service(inner);
    gate.handle_kv_signal(&1, Signal::Pressure(500_000)); // 625 ms
    let gated_call = tokio::spawn(svc.clone().oneshot(req(1, 0)));
    settle().await;
    assert_eq!(
        window.in_flight(&1),
        0,
        "waiting out the gate holds no credit"
    );
    let (_, reply) = handle.next_request().await.unwrap();
    assert_eq!(window.in_flight(&1), 1);
    assert_eq!(gate.runtime().now(), Instant::from_millis(625));
    reply.send_response(WRITTEN);
    gated_call.await.unwrap().unwrap();
    assert_eq!(window.in_flight(&1), 0);
}
