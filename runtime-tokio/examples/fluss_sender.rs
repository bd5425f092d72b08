//! The shape of the Fluss Rust writer's sender: one task owns a `WriteGate` (no lock, no
//! `GateHandle`) and runs a `tokio::select!` loop over batches, metadata snapshots and the
//! gate's timer (`GateSleep`). A fake tablet server rejects some writes: disk write-locked
//! (a jittered backoff), KV pressure piggybacked on a success (`3000 ms · p²`) and a KV hard
//! rejection (the whole 3 s, never shortened). Mid-run, a snapshot drops table 2
//! (`retain`), another loses and then restores the leader of bucket (1, 1)
//! (`handle_leader`). Paused tokio time: the run is virtual seconds, real milliseconds.
//!
//! `cargo run -p throttle-tokio --example fluss_sender`

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use throttle_tokio::sync::{client_rng, next_client_id};
use throttle_tokio::write_gate::{WriteGate, WriteGateConfig};
use throttle_tokio::{GateSleep, GateState, Instant, Signal};
use tokio::sync::mpsc;

/// `(table id, bucket id)`, Fluss's `TableBucket`.
type Bucket = (u64, u32);
/// A metadata snapshot: every live bucket and whether its leader is known.
type Snapshot = BTreeMap<Bucket, bool>;

/// What the fake tablet server answers to one write.
enum Response {
    Ok { pressure: f32 },
    DiskWriteLocked,
    StorageBackpressure,
}

/// Bucket (1, 0) is disk-locked for its first two writes, (1, 1) reports KV pressure 0.5,
/// (2, 0) rejects its first write outright.
fn serve(bucket: Bucket, nth_write: u32) -> Response {
    match (bucket, nth_write) {
        ((1, 0), 0 | 1) => Response::DiskWriteLocked,
        ((1, 1), _) => Response::Ok { pressure: 0.5 },
        ((2, 0), 0) => Response::StorageBackpressure,
        _ => Response::Ok { pressure: 0.0 },
    }
}

/// A core instant in whole milliseconds, for the log.
fn ms(t: Instant) -> u64 {
    t.as_nanos() / 1_000_000
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = WriteGateConfig::fluss_landed().with_kv_hard_rejection_never_shorten()?;
    let mut gate: WriteGate<Bucket, RandomState> = WriteGate::new(cfg)?;
    let mut rng = client_rng(next_client_id());
    let mut sleep = GateSleep::starting_now();
    let (batch_tx, mut batches) = mpsc::channel::<(Bucket, u32)>(64);
    let (meta_tx, mut snapshots) = mpsc::channel::<Snapshot>(4);

    // The application: three batches per bucket, 100 ms apart.
    tokio::spawn(async move {
        for n in 0..3 {
            for b in [(1, 0), (1, 1), (2, 0)] {
                let _ = batch_tx.send((b, n)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // The metadata updater: whole snapshots, as the client swaps them.
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        let live = |leader_11: bool| Snapshot::from([((1, 0), true), ((1, 1), leader_11)]);
        for (at, snapshot) in [(400, live(true)), (600, live(false)), (900, live(true))] {
            tokio::time::sleep_until(start + Duration::from_millis(at)).await;
            let _ = meta_tx.send(snapshot).await;
        }
    });

    let mut queues: BTreeMap<Bucket, VecDeque<(u32, u32)>> = BTreeMap::new(); // (batch, attempts)
    let mut writes: BTreeMap<Bucket, u32> = BTreeMap::new();
    let mut sent: Vec<(u64, Bucket, u32)> = Vec::new();
    let mut dropped = BTreeSet::new();
    let (mut batches_open, mut snapshots_open) = (true, true);
    while batches_open || snapshots_open || queues.values().any(|q| !q.is_empty()) {
        tokio::select! {
            got = batches.recv(), if batches_open => match got {
                Some((b, n)) => queues.entry(b).or_default().push_back((n, 0)),
                None => batches_open = false,
            },
            got = snapshots.recv(), if snapshots_open => match got {
                Some(snapshot) => {
                    let now = sleep.now();
                    // A dropped table's buckets: forgotten by the gate, their batches failed.
                    gate.retain(|b| snapshot.contains_key(b));
                    queues.retain(|b, q| {
                        let live = snapshot.contains_key(b);
                        if !live {
                            dropped.extend(q.drain(..).map(|(n, _)| (*b, n)));
                        }
                        live
                    });
                    for (b, &known) in &snapshot {
                        gate.handle_leader(now, b, known);
                    }
                    assert_eq!(gate.explain(now, &(2, 0)), None, "the dropped bucket's 3 s hold is gone");
                    let held = gate.len();
                    println!("{:>5} ms  snapshot {snapshot:?}, gate holds {held}", ms(now));
                }
                None => snapshots_open = false,
            },
            _ = sleep.fired() => gate.handle_timeout(sleep.now()),
        }
        // Drain each bucket while the gate lets it through (closed: the timer wakes us;
        // unknown leader: the next snapshot does).
        let now = sleep.now();
        for (&b, queue) in &mut queues {
            while let Some(&(n, attempts)) = queue.front() {
                if gate.check(now, &b) != GateState::Open {
                    break;
                }
                let nth = writes.entry(b).or_default();
                let (what, wait) = match serve(b, *nth) {
                    Response::Ok { pressure } => {
                        queue.pop_front();
                        sent.push((ms(now), b, n));
                        gate.handle_success(now, &b);
                        let p = Signal::from_f32(pressure);
                        ("written", gate.handle_kv_signal(now, &b, p))
                    }
                    Response::DiskWriteLocked => {
                        let wait = gate.handle_disk_write_locked(now, &b, attempts, &mut rng);
                        ("DISK_WRITE_LOCKED", wait)
                    }
                    Response::StorageBackpressure => (
                        "KV hard rejection",
                        gate.handle_kv_signal(now, &b, Signal::Full),
                    ),
                };
                *nth += 1;
                if what != "written" {
                    queue.front_mut().iter_mut().for_each(|head| head.1 += 1); // one more attempt
                }
                println!("{:>5} ms  {b:?} batch {n}: {what}, held {wait:?}", ms(now));
            }
        }
        while gate.poll_action().is_some() {} // every pass re-checks all queues anyway
        sleep.update(gate.poll_timeout());
    }

    // What a maintainer checks: everything live was written once and in order, nothing of
    // the dropped table was, and every hold was honoured.
    let of = |b: Bucket| {
        sent.iter()
            .filter(move |s| s.1 == b)
            .map(|s| (s.0, s.2))
            .collect::<Vec<_>>()
    };
    let (disk, kv) = (of((1, 0)), of((1, 1)));
    assert_eq!(disk.iter().map(|s| s.1).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(
        disk[0].0 >= 800 + 1_600,
        "two disk backoffs (1 s, then 2 s, ±20 %): {disk:?}"
    );
    assert_eq!(kv.iter().map(|s| s.1).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(
        kv.windows(2).all(|w| w[1].0 - w[0].0 >= 750),
        "p = 0.5 holds 750 ms: {kv:?}"
    );
    assert!(
        !kv.iter().any(|s| (600..900).contains(&s.0)),
        "no send without a leader: {kv:?}"
    );
    assert!(
        of((2, 0)).is_empty() && dropped.len() == 3,
        "table 2 dropped: {dropped:?}"
    );
    assert!(gate.is_empty(), "every hold ended and was evicted");
    println!(
        "ok: {} batches written, {} failed with their dropped table",
        sent.len(),
        dropped.len()
    );
    Ok(())
}
