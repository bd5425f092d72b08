//! A producer on tokio: 400 records to 4 buckets through `sync::WriteDriver` (the paced writer,
//! its write gate and its send loop), against an in-process server that answers "disk write
//! locked" for its first 300 ms and then piggybacks KV backpressure on every write.
//!
//! ```text
//! cargo run -p throttle-tokio --example producer
//! ```
//!
//! The driver backs the rejected buckets off (1 s ± 20 %) instead of resending at once, then
//! paces the buckets by the piggybacked pressure. The program prints how many records were
//! written and what the server saw: requests, records, batches rejected.
//!
//! Glue (every line but the wire, the server, imports, blank lines and comments): the 20 lines
//! of `main`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use throttle_tokio::paced_writer::{PacedWriterConfig, WriteOutcome};
use throttle_tokio::sync::{SendBatch, WriteDriver};
use throttle_tokio::{Signal, TokioRuntime};
use tokio::sync::{mpsc, oneshot};

// ----------------------------------------------------------------- the wire (not glue)

/// The server's answer for one batch: code 0 written (with the KV pressure it reports), code 1
/// `DISK_WRITE_LOCKED`.
#[derive(Clone, Copy, Debug)]
struct Answer {
    code: u8,
    pressure: f32,
}

impl Answer {
    /// The wire code as the paced writer sees it (the driver's `WriteClassifier`).
    fn outcome(&self) -> WriteOutcome {
        match self.code {
            0 => WriteOutcome::Ok {
                pressure: Signal::from_f32(self.pressure),
            },
            _ => WriteOutcome::DiskWriteLocked,
        }
    }
}

/// One request: the batches (bucket, records), and where to put the answers.
type Rpc = (Vec<(u32, Vec<Vec<u8>>)>, oneshot::Sender<Vec<Answer>>);

/// Puts a request on the wire and waits for one answer per batch.
async fn rpc(
    server: mpsc::UnboundedSender<Rpc>,
    batches: Vec<SendBatch<u32, Vec<u8>>>,
) -> Vec<Answer> {
    let (reply, answer) = oneshot::channel();
    let wire = batches.into_iter().map(|b| (b.bucket, b.records)).collect();
    let _ = server.send((wire, reply));
    answer.await.unwrap_or_default() // no answer: the driver counts each batch as retriable
}

// ---------------------------------------------------------- the in-process server (not glue)

/// What the server saw: requests, records written, batches rejected, and when it last wrote.
#[derive(Default)]
struct ServerStats {
    rpcs: AtomicU64,
    records: AtomicU64,
    rejected: AtomicU64,
    last_write_ms: AtomicU64,
}

impl fmt::Display for ServerStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        write!(
            f,
            "{} requests, {} records written (the last at {} ms), {} batches rejected",
            get(&self.rpcs),
            get(&self.records),
            get(&self.last_write_ms),
            get(&self.rejected)
        )
    }
}

/// Disk protection for 300 ms, then KV pressure falling from 0.6 to 0 over the next second.
fn spawn_server() -> (mpsc::UnboundedSender<Rpc>, Arc<ServerStats>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Rpc>();
    let stats = Arc::new(ServerStats::default());
    let seen = stats.clone();
    let started = Instant::now();
    tokio::spawn(async move {
        while let Some((batches, reply)) = rx.recv().await {
            seen.rpcs.fetch_add(1, Ordering::Relaxed);
            let age = started.elapsed();
            let answer = if age < Duration::from_millis(300) {
                seen.rejected
                    .fetch_add(batches.len() as u64, Ordering::Relaxed);
                Answer {
                    code: 1,
                    pressure: 0.0,
                }
            } else {
                let records: usize = batches.iter().map(|(_, r)| r.len()).sum();
                seen.records.fetch_add(records as u64, Ordering::Relaxed);
                seen.last_write_ms
                    .store(age.as_millis() as u64, Ordering::Relaxed);
                let pressure = (0.6 * (1.3 - age.as_secs_f32())).max(0.0);
                Answer { code: 0, pressure }
            };
            tokio::time::sleep(Duration::from_millis(2)).await; // service time
            let _ = reply.send(vec![answer; batches.len()]);
        }
    });
    (tx, stats)
}

const USAGE: &str = "usage: producer

Writes 400 records through throttle's WriteDriver to an in-process server that rejects
writes for 300 ms and then piggybacks backpressure, and prints what the server saw.";

// ------------------------------------------------------------------------------- the producer

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        return println!("{USAGE}");
    }
    let (server, stats) = spawn_server();
    let send = move |_node: u32, batches| rpc(server.clone(), batches);
    let cfg = PacedWriterConfig::default().with_batch_bytes(64);
    let driver = WriteDriver::new(TokioRuntime::new(), cfg, send, Answer::outcome).unwrap();
    (0..4).for_each(|bucket| driver.set_leader(bucket, Some(0)));
    let record = |i: u32| driver.append(i % 4, i.to_le_bytes().to_vec(), 4);
    let pending: Vec<_> = (0..400).map(record).collect();
    for record in pending {
        record.await.expect("every record is written"); // exits non-zero otherwise
    }
    driver.close();
    driver.closed().await;
    println!("400/400 records written; the server saw {stats}");
}
