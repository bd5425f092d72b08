//! `WriteDriver` on async-std (`throttle_async_std::WriteDriver`), on its real clock and timer:
//! a few records over two buckets, one disk-locked rejection waited out on the timer, every
//! record acked exactly once, and `close` plus `closed().await` waiting for a batch in flight.
//! Short: the backoff is 40 ms and the server answers in 2 ms.

use core::time::Duration;
use std::sync::{Arc, Mutex};

use throttle_async_std::backoff::{BackoffConfig, Jitter};
use throttle_async_std::paced_writer::{PacedWriterConfig, WriteOutcome};
use throttle_async_std::sync::SendBatch;
use throttle_async_std::{AsyncStdRuntime, Instant, Signal, WriteDriver, WriteGateConfig};

const BACKOFF: Duration = Duration::from_millis(40);

/// What the server saw: when, which bucket, which records, and what it answered.
type Log = Arc<Mutex<Vec<(Instant, u32, Vec<u32>, bool)>>>;

/// A driver whose server rejects bucket 1's first batch as disk write locked and acks every
/// other batch after `delay`; one record per batch (`batch_bytes` 1), a fixed 40 ms disk
/// backoff.
fn driver(rt: AsyncStdRuntime, log: Log, delay: Duration) -> WriteDriver<u32, u16, u32, bool> {
    let disk = BackoffConfig::builder()
        .initial(BACKOFF)
        .max(BACKOFF)
        .jitter(Jitter::None)
        .build()
        .unwrap();
    let cfg = PacedWriterConfig::default()
        .with_batch_bytes(1)
        .with_gate(WriteGateConfig::default().with_disk_write_locked(disk));
    WriteDriver::new(
        rt,
        cfg,
        move |_node: u16, batches: Vec<SendBatch<u32, u32>>| {
            let mut seen = log.lock().unwrap();
            let answers: Vec<bool> = batches
                .iter()
                .map(|b| {
                    let first_of_1 = b.bucket == 1 && seen.iter().all(|(_, k, _, _)| *k != 1);
                    seen.push((rt.now(), b.bucket, b.records.clone(), !first_of_1));
                    !first_of_1
                })
                .collect();
            async move {
                async_std::task::sleep(delay).await;
                answers
            }
        },
        |written: &bool| match written {
            true => WriteOutcome::Ok {
                pressure: Signal::Clear,
            },
            false => WriteOutcome::DiskWriteLocked,
        },
    )
    .expect("valid config")
}

async fn within<F: core::future::Future>(f: F) -> F::Output {
    async_std::future::timeout(Duration::from_secs(10), f)
        .await
        .expect("stranded: still pending after 10 s")
}

#[test]
fn records_are_acked_once_after_a_disk_rejection_waited_out_on_the_timer() {
    let rt = AsyncStdRuntime::new();
    let log = Log::default();
    let d = driver(rt, log.clone(), Duration::from_millis(2));
    d.set_leader(1, Some(10));
    d.set_leader(2, Some(10));
    let results = async_std::task::block_on(async {
        let appends: Vec<_> = [(1, 100), (1, 101), (1, 102), (2, 200), (2, 201)]
            .into_iter()
            .map(|(bucket, record)| d.append(bucket, record, 1))
            .collect();
        let mut results = Vec::new();
        for a in appends {
            results.push(within(a).await);
        }
        d.close();
        within(d.closed()).await;
        results
    });
    assert_eq!(results, vec![Ok(()); 5], "every record acked");
    let log = log.lock().unwrap().clone();
    // Written exactly once each, in order within a bucket.
    let written = |bucket: u32| -> Vec<u32> {
        log.iter()
            .filter(|(_, b, _, ok)| *b == bucket && *ok)
            .flat_map(|(_, _, r, _)| r.clone())
            .collect()
    };
    assert_eq!(written(1), [100, 101, 102]);
    assert_eq!(written(2), [200, 201]);
    // Bucket 1: one rejection, and its retry only after the backoff on the real timer.
    let sends_1: Vec<_> = log.iter().filter(|(_, b, _, _)| *b == 1).collect();
    assert_eq!(sends_1.len(), 4, "one rejected send, then three writes");
    assert_eq!((&sends_1[0].2, sends_1[0].3), (&vec![100], false));
    assert_eq!((&sends_1[1].2, sends_1[1].3), (&vec![100], true));
    let gap = sends_1[1].0.saturating_duration_since(sends_1[0].0);
    assert!(gap >= BACKOFF, "retried {gap:?} after the rejection");
    assert_eq!((d.pending_batches(), d.in_flight()), (0, 0));
}

#[test]
fn closed_waits_for_the_batch_in_flight() {
    let rt = AsyncStdRuntime::new();
    let log = Log::default();
    let d = driver(rt, log.clone(), Duration::from_millis(30));
    d.set_leader(2, Some(10));
    async_std::task::block_on(async {
        let sent = d.append(2, 200, 1);
        let queued = d.append(2, 201, 1); // behind the one in flight: not sent before close
        while d.in_flight() == 0 {
            async_std::task::sleep(Duration::from_millis(1)).await;
        }
        let start = rt.now();
        d.close();
        within(d.closed()).await;
        assert!(
            rt.now().saturating_duration_since(start) >= Duration::from_millis(20),
            "closed() resolved before the in-flight batch's answer"
        );
        assert_eq!(within(sent).await, Ok(()));
        assert!(
            within(queued).await.is_err(),
            "a record held back fails on close"
        );
    });
    assert_eq!(log.lock().unwrap().len(), 1, "nothing sent after the close");
}
