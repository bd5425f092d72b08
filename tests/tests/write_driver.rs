//! `sync::WriteDriver` on tokio with paused time: the paced writer's loop owned by the driver.
//! Probe mode does not spin (send calls counted), `max_retries` is respected, `close` plus
//! `closed().await` waits for the batches in flight, leader refresh, and user code that
//! panics fails only its own records.

use core::time::Duration;
use std::error::Error as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use throttle_sansio::paced_writer::{FailCause, PacedWriterConfig, WriteOutcome};
use throttle_sansio::sync::{SendBatch, WriteDriver, WriteError};
use throttle_sansio::write_gate::{Reason, WriteGateConfig};
use throttle_sansio::{Instant, Signal};
use throttle_tokio::TokioRuntime;

/// The server's answer for one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    DiskLocked,
    Retry,
    /// The classifier panics on it.
    Poison,
}

fn classify(a: &Answer) -> WriteOutcome {
    match a {
        Answer::Ok => WriteOutcome::Ok {
            pressure: Signal::Clear,
        },
        Answer::DiskLocked => WriteOutcome::DiskWriteLocked,
        Answer::Retry => WriteOutcome::Retriable,
        Answer::Poison => panic!("the classifier panics"),
    }
}

/// One batch the server received: when, on which node, its bucket and records.
type Sent = (Instant, u32, u32, Vec<u32>);

type Driver = WriteDriver<TokioRuntime, u32, u32, u32, Answer>;

/// A server whose answer per send is given by `script(send number, node, batch)`; it records
/// every send (time, node, bucket, records) and answers after `delay`.
#[derive(Clone)]
struct Server {
    sends: Arc<Mutex<Vec<Sent>>>,
    calls: Arc<AtomicUsize>,
}

impl Server {
    fn new() -> Self {
        Server {
            sends: Arc::default(),
            calls: Arc::default(),
        }
    }

    fn driver(
        &self,
        cfg: PacedWriterConfig,
        delay: Duration,
        script: impl Fn(usize, u32, &SendBatch<u32, u32>) -> Answer + Send + Sync + 'static,
    ) -> Driver {
        let rt = TokioRuntime::new();
        let (sends, calls, clock) = (self.sends.clone(), self.calls.clone(), rt.clone());
        let script = Arc::new(script);
        WriteDriver::new(
            rt,
            cfg,
            move |node: u32, batches: Vec<SendBatch<u32, u32>>| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                assert!(node != 66, "the send closure panics for node 66");
                let answers: Vec<Answer> = batches.iter().map(|b| script(n, node, b)).collect();
                let mut log = sends.lock().unwrap();
                for b in &batches {
                    log.push((clock.now(), node, b.bucket, b.records.clone()));
                }
                async move {
                    tokio::time::sleep(delay).await;
                    assert!(node != 77, "the send future panics for node 77");
                    answers
                }
            },
            classify,
        )
        .expect("valid config")
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn within<F: core::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(3600), f)
        .await
        .expect("stranded: still pending after an hour of paused time")
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn records_are_batched_per_bucket_and_acked() {
    let server = Server::new();
    let d = server.driver(
        PacedWriterConfig::default(),
        Duration::from_millis(5),
        |_, _, _| Answer::Ok,
    );
    d.set_leader(1, Some(10));
    d.set_leader(2, Some(10));
    let a = d.append(1, 100, 10);
    let b = d.append(1, 101, 10);
    let c = d.append(2, 200, 10);
    assert_eq!(within(a).await, Ok(()));
    assert_eq!(within(b).await, Ok(()));
    assert_eq!(within(c).await, Ok(()));
    assert_eq!(server.calls(), 1, "one request for the node");
    let sends = server.sends.lock().unwrap().clone();
    let shape: Vec<(u32, u32, Vec<u32>)> =
        sends.into_iter().map(|(_, n, b, r)| (n, b, r)).collect();
    assert_eq!(shape, vec![(10, 1, vec![100, 101]), (10, 2, vec![200])]);
    d.close();
    within(d.closed()).await;
}

/// A disk rejection backs the bucket off: the retry comes about a second later, not at once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_disk_rejection_waits_out_the_backoff() {
    let server = Server::new();
    let d = server.driver(
        PacedWriterConfig::default(),
        Duration::from_millis(1),
        |n, _, _| {
            if n == 0 {
                Answer::DiskLocked
            } else {
                Answer::Ok
            }
        },
    );
    d.set_leader(1, Some(10));
    assert_eq!(within(d.append(1, 7, 1)).await, Ok(()));
    let sends = server.sends.lock().unwrap().clone();
    assert_eq!(sends.len(), 2);
    let gap = sends[1].0.saturating_duration_since(sends[0].0);
    assert!(
        gap >= Duration::from_millis(800) && gap <= Duration::from_millis(1_300),
        "{gap:?}"
    );
}

/// Probe mode: after its backoff the bucket may send one probe; the probe fails for good
/// (max_retries 1), so the bucket is `Probing` with records queued behind it. The driver must
/// not send again until the probe state lapses (5 s), however long it runs.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn probe_mode_does_not_spin() {
    let mut gate = WriteGateConfig::default();
    gate.set_probe(Reason::DISK_WRITE_LOCKED, Some(1)).unwrap();
    gate.set_probe_ttl(Reason::DISK_WRITE_LOCKED, Duration::from_secs(5))
        .unwrap();
    let cfg = PacedWriterConfig::default()
        .with_gate(gate)
        .with_max_retries(1)
        .with_batch_bytes(1);
    let server = Server::new();
    let d = server.driver(cfg, Duration::from_millis(1), |n, _, _| {
        if n < 2 {
            Answer::DiskLocked
        } else {
            Answer::Ok
        }
    });
    d.set_leader(1, Some(10));
    let start = tokio::time::Instant::now();
    let first = d.append(1, 1, 1);
    let second = d.append(1, 2, 1);
    let failed = within(first).await;
    assert!(matches!(
        failed,
        Err(WriteError::Failed(FailCause::RetriesExhausted { .. }))
    ));
    assert_eq!(server.calls(), 2, "the first send and the probe");
    // Four seconds while Probing: nothing is sent.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        server.calls(),
        2,
        "no send while the probe allowance is used up"
    );
    assert_eq!(within(second).await, Ok(()));
    assert_eq!(server.calls(), 3);
    let lapse = start.elapsed();
    assert!(
        lapse >= Duration::from_secs(5),
        "sent at the lapse, not before: {lapse:?}"
    );
    d.close();
    within(d.closed()).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn max_retries_is_respected_and_the_cause_is_the_source() {
    let server = Server::new();
    let cfg = PacedWriterConfig::default().with_max_retries(2);
    let d = server.driver(cfg, Duration::from_millis(1), |_, _, _| Answer::Retry);
    d.set_leader(1, Some(10));
    let err = within(d.append(1, 5, 1)).await.unwrap_err();
    assert_eq!(server.calls(), 3, "one send and two retries");
    assert_eq!(
        err,
        WriteError::Failed(FailCause::RetriesExhausted {
            last: WriteOutcome::Retriable
        })
    );
    assert_eq!(err.to_string(), "the record's batch was not written");
    let cause = err.source().expect("the cause is the source");
    assert!(
        cause.to_string().contains("after the last allowed retry"),
        "{cause}"
    );
}

/// `close` fails what is held back at once; `closed().await` resolves only once the batch in
/// flight (answered after 10 s) has ended, and that batch is still acked.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn close_then_closed_waits_for_the_batches_in_flight() {
    let server = Server::new();
    let cfg = PacedWriterConfig::default().with_batch_bytes(1);
    let d = server.driver(cfg, Duration::from_secs(10), |_, _, _| Answer::Ok);
    d.set_leader(1, Some(10));
    let start = tokio::time::Instant::now();
    let sent = tokio::spawn(d.append(1, 1, 1));
    let held = tokio::spawn(d.append(1, 2, 1)); // behind the batch in flight
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(d.in_flight(), 1);
    d.close();
    assert_eq!(
        within(held).await.unwrap(),
        Err(WriteError::Failed(FailCause::Closed))
    );
    assert_eq!(
        d.append(1, 3, 1).await,
        Err(WriteError::Failed(FailCause::Closed)),
        "intake stopped"
    );
    within(d.closed()).await;
    assert!(
        start.elapsed() >= Duration::from_secs(10),
        "waited for the answer"
    );
    assert_eq!(d.in_flight(), 0);
    assert_eq!(within(sent).await.unwrap(), Ok(()));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_unknown_leader_is_refreshed_through_the_callback() {
    let server = Server::new();
    let d = server.driver(
        PacedWriterConfig::default(),
        Duration::from_millis(1),
        |_, _, _| Answer::Ok,
    );
    let pending = d.append(4, 40, 1); // no leader yet: reported before the callback exists
    tokio::time::sleep(Duration::from_millis(1)).await;
    let refreshed = Arc::new(AtomicUsize::new(0));
    let (d2, r2) = (d.clone(), refreshed.clone());
    d.on_leader_unknown(move |bucket| {
        r2.fetch_add(1, Ordering::SeqCst);
        d2.set_leader(bucket, Some(20));
    });
    assert_eq!(within(pending).await, Ok(()));
    assert_eq!(refreshed.load(Ordering::SeqCst), 1);
    assert_eq!(server.sends.lock().unwrap()[0].1, 20);
}

/// The send closure, its future and the classifier each panic for some batches: those
/// records fail with `Panicked`, the rest are written, nothing is stranded.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn panicking_user_code_fails_only_its_records() {
    let server = Server::new();
    let d = server.driver(
        PacedWriterConfig::default(),
        Duration::from_millis(1),
        |_, _, b| {
            if b.records.contains(&99) {
                Answer::Poison
            } else {
                Answer::Ok
            }
        },
    );
    for (bucket, node) in [(1, 66), (2, 77), (3, 10), (4, 10)] {
        d.set_leader(bucket, Some(node));
    }
    let closure = d.append(1, 1, 1);
    let future = d.append(2, 2, 1);
    let classifier = d.append(3, 99, 1);
    let fine = d.append(4, 4, 1);
    let panicked = Err(WriteError::Panicked(throttle_sansio::sync::Panicked));
    assert_eq!(within(closure).await, panicked);
    assert_eq!(within(future).await, panicked);
    assert_eq!(within(classifier).await, panicked);
    assert_eq!(within(fine).await, Ok(()));
    // The driver keeps serving the same buckets.
    d.set_leader(1, Some(10));
    assert_eq!(within(d.append(1, 5, 1)).await, Ok(()));
    d.close();
    within(d.closed()).await;
    assert_eq!(d.pending_batches(), 0);
}

/// `reseed` replaces the per-client jitter: two drivers given the same seed wait exactly the
/// same disk backoff before their retry, a third given another seed waits another time.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn reseed_makes_the_backoff_jitter_reproducible() {
    async fn retry_gap(seed: u64) -> Duration {
        let server = Server::new();
        let d = server.driver(
            PacedWriterConfig::default(),
            Duration::from_millis(1),
            |n, _, _| {
                if n == 0 {
                    Answer::DiskLocked
                } else {
                    Answer::Ok
                }
            },
        );
        d.reseed(seed);
        d.set_leader(1, Some(10));
        assert_eq!(within(d.append(1, 7, 1)).await, Ok(()));
        d.close();
        within(d.closed()).await;
        let sends = server.sends.lock().unwrap().clone();
        assert_eq!(sends.len(), 2);
        sends[1].0.saturating_duration_since(sends[0].0)
    }
    let (a, b, c) = (
        retry_gap(42).await,
        retry_gap(42).await,
        retry_gap(43).await,
    );
    assert_eq!(a, b, "the same seed draws the same delay");
    assert_ne!(a, c, "another seed draws another delay");
}
