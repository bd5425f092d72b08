//! A custom runtime: one plain `std` thread drives the core `PacedWriter` on `std::time::Instant`
//! (a `StdEpoch`), no async runtime: each turn `handle_timeout`, `drain`, carry out the actions,
//! then sleep in `recv_timeout` until `poll_timeout` or an answer (fed to `handle_response`).
//! Every decision (batching, one batch per bucket in flight, backoff, KV pressure delay,
//! retries) is the writer's. The fake server (a thread, std channels) locks bucket 0's disk for
//! two batches, piggybacks pressure on bucket 1's first two answers, and counts batches that
//! reach a bucket before its gate could open. Exits 1 if a write is missing, duplicated or early.
//!
//! `cargo run -p throttle-sansio --features std --example custom_runtime`
use std::hash::RandomState;
use std::process::ExitCode;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread;
use std::time::{Duration, Instant as StdInstant};

use throttle_sansio::paced_writer::{BatchId, WriteOutcome, WriterAction};
use throttle_sansio::sync::{client_rng, next_client_id};
use throttle_sansio::time::StdEpoch;
use throttle_sansio::{
    BackoffConfig, PacedWriter, PacedWriterConfig, Signal, ThrottleCurve, WriteGateConfig,
};

const BUCKETS: u32 = 3;
const RECORDS: u32 = 6; // per bucket, two to a batch
const DISK: Duration = Duration::from_millis(30); // ±20 % jitter: never under 24 ms
const HALF_PRESSURE: Duration = Duration::from_millis(25); // a 100 ms ceiling x 0.5²

/// A request: its batches (id, bucket, records). Its answer: one outcome per batch (the
/// server speaks `WriteOutcome` here, so the client needs no classifier).
type Request = Vec<(BatchId, u32, Vec<u32>)>;
type Answer = Vec<(BatchId, WriteOutcome)>;

/// The in-process server: returns the records it wrote and the batches that came early.
fn server(requests: Receiver<Request>, answers: Sender<Answer>) -> (Vec<u32>, u32) {
    let (mut written, mut early, mut locks, mut pressed) = (Vec::new(), 0, 0, 0);
    let mut not_before = [StdInstant::now(); BUCKETS as usize];
    for request in requests {
        let mut answer = Vec::new();
        for (id, bucket, records) in request {
            let (b, now) = (bucket as usize, StdInstant::now());
            early += u32::from(now < not_before[b]);
            let outcome = if bucket == 0 && locks < 2 {
                locks += 1;
                not_before[b] = now + DISK * 3 / 4; // below the jitter floor
                WriteOutcome::DiskWriteLocked
            } else {
                written.extend(records);
                pressed += u32::from(bucket == 1);
                let pressure = if bucket == 1 && pressed <= 2 {
                    not_before[b] = now + HALF_PRESSURE; // the curve's delay at half pressure
                    Signal::Pressure(500_000)
                } else {
                    Signal::Clear
                };
                WriteOutcome::Ok { pressure }
            };
            answer.push((id, outcome));
        }
        let _ = answers.send(answer);
    }
    (written, early)
}

/// Fast delays for a demo: a 30 ms disk backoff (the builder's doubling and ±20 % jitter), and
/// a 100 ms ceiling for the KV curve.
fn config() -> Option<PacedWriterConfig> {
    let disk = BackoffConfig::builder().initial(DISK).max(DISK * 4);
    let curve = ThrottleCurve::builder().max_throttle(HALF_PRESSURE * 4);
    let (disk, curve) = (disk.build().ok()?, curve.build().ok()?);
    let gate = WriteGateConfig::default().with_kv_curve(curve);
    let cfg = PacedWriterConfig::default().with_batch_bytes(2);
    Some(cfg.with_gate(gate.with_disk_write_locked(disk)))
}

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("custom_runtime: a std thread loop driving a PacedWriter through poll_timeout.\n");
        println!("Usage: cargo run -p throttle-sansio --features std --example custom_runtime");
        return ExitCode::SUCCESS;
    }
    let Some(Ok(mut writer)) = config().map(PacedWriter::<u32, u8, u32, RandomState>::new) else {
        return ExitCode::FAILURE;
    };
    let (mut rng, epoch) = (client_rng(next_client_id()), StdEpoch::new());
    let ((req_tx, req_rx), (ans_tx, ans_rx)) = (channel(), channel());
    let server = thread::spawn(move || server(req_rx, ans_tx));
    let mut expected = Vec::new();
    for b in 0..BUCKETS {
        writer.set_leader(epoch.now(), b, Some(1)); // one node: one request per turn
        for n in 0..RECORDS {
            let _ = writer.append(epoch.now(), b, b * 100 + n, 1); // 1 byte each
            expected.push(b * 100 + n);
        }
    }
    let started = StdInstant::now();
    let deadline = started + Duration::from_secs(10);
    let (mut acked, mut failed) = (0, 0);
    while StdInstant::now() < deadline {
        let now = epoch.now();
        writer.handle_timeout(now);
        writer.drain(now);
        let mut request = Request::new();
        while let Some(action) = writer.poll_action() {
            match action {
                WriterAction::Send { batch, bucket, .. } => {
                    let records = writer.batch(batch).map(|b| b.records().to_vec());
                    request.push((batch, bucket, records.unwrap_or_default()));
                }
                WriterAction::Acked { batch } => acked += batch.len() as u32,
                WriterAction::Failed { batch, .. } => failed += batch.len() as u32,
                _ => {} // RefreshLeader: every leader is known here
            }
        }
        let done = acked + failed == BUCKETS * RECORDS;
        if done || (!request.is_empty() && req_tx.send(request).is_err()) {
            break;
        }
        // Sleep until the next answer or the writer's wake, whichever comes first.
        let budget = deadline.saturating_duration_since(StdInstant::now());
        let now = epoch.now();
        let wake = writer.poll_timeout().unwrap_or(now + budget);
        match ans_rx.recv_timeout(wake.saturating_duration_since(now).min(budget)) {
            Ok(answer) => {
                for (id, outcome) in answer {
                    let _ = writer.handle_response(epoch.now(), id, outcome, &mut rng);
                }
            }
            Err(RecvTimeoutError::Timeout) => {} // the writer's wake is due: the next turn
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    drop(req_tx);
    let (mut written, early) = server.join().unwrap_or_default();
    written.sort_unstable();
    println!(
        "wrote {} records, {early} early, in {:?}",
        written.len(),
        started.elapsed()
    );
    if written == expected && early == 0 && failed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("misbehaved: wrote {written:?}, {early} early, {failed} records failed");
        ExitCode::FAILURE
    }
}
