//! A custom runtime: one plain `std` thread drives a write gate with `std::time::Instant`, no
//! async runtime. It sends at most one write per bucket, sleeps in `recv_timeout` until the
//! gate's `poll_timeout` or the next response, and answers each response with a gate input.
//! The fake server (another thread, std channels) locks bucket 0's disk for two writes and
//! piggybacks pressure on bucket 1's first answers, and checks that no write reaches a
//! bucket before the gate could have opened it. Exits 1 if anything misbehaves.
//!
//! `cargo run -p throttle-sansio --features std --example custom_runtime`
use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread;
use std::time::{Duration, Instant as StdInstant};

use throttle_sansio::backoff::Jitter;
use throttle_sansio::sync::{client_rng, next_client_id};
use throttle_sansio::time::StdEpoch;
use throttle_sansio::{
    BackoffConfig, GateState, Signal, ThrottleCurve, WriteGate, WriteGateConfig,
};

const BUCKETS: u32 = 3;
const WRITES_PER_BUCKET: u32 = 4;
const DISK: Duration = Duration::from_millis(30); // ±20 %: never under 24 ms
const HALF_PRESSURE: Duration = Duration::from_millis(25); // 100 ms ceiling x 0.5²

enum Outcome {
    Written(Signal),
    DiskWriteLocked,
}

/// The in-process server: returns the writes it applied and the early arrivals it saw.
fn server(requests: Receiver<(u32, u32)>, responses: Sender<(u32, Outcome)>) -> (Vec<u32>, u32) {
    let (mut applied, mut early, mut locks) = (Vec::new(), 0, 0);
    let mut not_before = [StdInstant::now(); BUCKETS as usize];
    for (bucket, seq) in requests {
        let b = bucket as usize;
        early += u32::from(StdInstant::now() < not_before[b]);
        let outcome = if bucket == 0 && locks < 2 {
            locks += 1;
            not_before[b] = StdInstant::now() + DISK * 3 / 4; // below the 24 ms jitter floor
            Outcome::DiskWriteLocked
        } else if bucket == 1 && applied.iter().filter(|s| *s / 100 == 1).count() < 2 {
            not_before[b] = StdInstant::now() + HALF_PRESSURE;
            applied.push(seq);
            Outcome::Written(Signal::Pressure(500_000))
        } else {
            applied.push(seq);
            Outcome::Written(Signal::Clear)
        };
        let _ = responses.send((bucket, outcome));
    }
    (applied, early)
}

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("custom_runtime: a std thread loop driving a WriteGate through poll_timeout.\n");
        println!("Usage: cargo run -p throttle-sansio --features std --example custom_runtime");
        return ExitCode::SUCCESS;
    }
    let disk = BackoffConfig::builder()
        .initial(DISK)
        .max(DISK * 4)
        .multiplier(2, 1);
    let disk = disk.jitter(Jitter::Proportional { ppm: 200_000 }).build();
    let curve = ThrottleCurve::builder()
        .exponent(2)
        .max_throttle(Duration::from_millis(100));
    let (Ok(disk), Ok(curve)) = (disk, curve.build()) else {
        return ExitCode::FAILURE;
    };
    let cfg = WriteGateConfig::default()
        .with_disk_write_locked(disk)
        .with_kv_curve(curve);
    let Ok(mut gate) = WriteGate::<u32, std::hash::RandomState>::new(cfg) else {
        return ExitCode::FAILURE;
    };
    let (mut rng, epoch) = (client_rng(next_client_id()), StdEpoch::new());

    let ((req_tx, req_rx), (resp_tx, resp_rx)) = (channel(), channel());
    let server = thread::spawn(move || server(req_rx, resp_tx));
    // Per bucket: the writes still to make (seq = bucket·100 + n), and the attempts of its head.
    let mut queues: Vec<VecDeque<u32>> = (0..BUCKETS)
        .map(|b| (0..WRITES_PER_BUCKET).map(|n| b * 100 + n).collect())
        .collect();
    let (mut in_flight, mut attempts) = ([false; BUCKETS as usize], [0u32; BUCKETS as usize]);
    let (started, deadline) = (
        StdInstant::now(),
        StdInstant::now() + Duration::from_secs(10),
    );
    while queues.iter().any(|q| !q.is_empty()) && StdInstant::now() < deadline {
        let now = epoch.now();
        for b in 0..BUCKETS {
            let i = b as usize;
            // `Probing` waits for a success, `UnknownLeader` for a refresh (none here): only `Open` sends.
            let open = gate.check(now, &b) == GateState::Open;
            if let (false, true, Some(&seq)) = (in_flight[i], open, queues[i].front()) {
                gate.handle_send(now, &b);
                in_flight[i] = req_tx.send((b, seq)).is_ok();
            }
        }
        // Sleep until the next response or the gate's next opening, whichever comes first.
        let budget = deadline.saturating_duration_since(StdInstant::now());
        let wait = gate
            .poll_timeout()
            .map_or(budget, |at| (at - now).min(budget));
        let response = resp_rx.recv_timeout(wait);
        let now = epoch.now();
        match response {
            Ok((b, Outcome::Written(signal))) => {
                let i = b as usize;
                (in_flight[i], attempts[i]) = (false, 0);
                queues[i].pop_front();
                gate.handle_success(now, &b);
                gate.handle_kv_signal(now, &b, signal);
            }
            Ok((b, Outcome::DiskWriteLocked)) => {
                let i = b as usize;
                let wait = gate.handle_disk_write_locked(now, &b, attempts[i], &mut rng);
                (in_flight[i], attempts[i]) = (false, attempts[i] + 1);
                println!("bucket {b}: disk write locked, retry in {wait:?}");
            }
            Err(RecvTimeoutError::Timeout) => gate.handle_timeout(now), // an opening is due
            Err(RecvTimeoutError::Disconnected) => break,
        }
        // Nobody sleeps on an old deadline here (each round re-reads the gate): drop the Wakes.
        while gate.poll_action().is_some() {}
    }
    drop(req_tx);
    let (mut applied, early) = server.join().unwrap_or_default();
    applied.sort_unstable();
    let expected: Vec<u32> = (0..BUCKETS)
        .flat_map(|b| (0..WRITES_PER_BUCKET).map(move |n| b * 100 + n))
        .collect();
    println!(
        "applied {} writes in {:?}, {early} early",
        applied.len(),
        started.elapsed()
    );
    if applied == expected && early == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("misbehaved: applied {applied:?}, {early} writes arrived before the opening");
        ExitCode::FAILURE
    }
}
