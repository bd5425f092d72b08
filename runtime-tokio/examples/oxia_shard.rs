//! A per-shard writer shaped like the Oxia client's shard manager, owning a `SingleWindow`.
//!
//! Four tasks submit 200 writes at once. The shard task cuts them into batches of at most 8
//! and sends them on an ordered write stream to a fake in-process server that answers in
//! order. At most 4 batches are in flight; while the window is full, the open batch parks and
//! keeps growing. Each answer completes the oldest credit, and the window hands it on to the
//! next held batch. Mid-run the stream breaks: every batch in flight fails (its writers get
//! an error) and its credit is completed once, which hands held batches to the new stream.
//! When the writers stop, a draining close sends everything still held back. Exits non-zero
//! unless every write ends exactly once and the server saw the acked ones in arrival order.
//!
//! `cargo run -p throttle-tokio --example oxia_shard`

use std::collections::VecDeque;
use std::mem::take;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use throttle_sansio::dispatch_window::{CreditId, Dispatch, SingleWindow};
use tokio::sync::{mpsc, oneshot};

type Reply = oneshot::Sender<Result<u64, &'static str>>;
type Batch = Vec<(u64, Reply)>; // (arrival number, the writer's reply)
type Log = Arc<Mutex<Vec<u64>>>; // the writes the server applied
type Stream = (mpsc::Sender<Vec<u64>>, mpsc::Receiver<()>);

/// An ordered stream to the fake server: answers each batch after 2 ms, in order. With
/// `break_at`, the stream breaks (both ends drop) when that batch arrives.
fn connect(break_at: Option<usize>, log: Log) -> Stream {
    let ((requests, mut rx), (answers, answers_rx)) = (mpsc::channel(64), mpsc::channel(64));
    tokio::spawn(async move {
        for n in 0.. {
            let Some(writes) = rx.recv().await else {
                return;
            };
            if Some(n) == break_at {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            log.lock().expect("log").extend(writes);
            if answers.send(()).await.is_err() {
                return;
            }
        }
    });
    (requests, answers_rx)
}

struct Shard {
    window: SingleWindow<Batch>,
    open: Batch,
    arrived: u64,
    stream: Stream,
    /// The stream answers in order, so its next answer is for the oldest batch in flight.
    in_flight: VecDeque<(CreditId, Batch)>,
}

impl Shard {
    fn send(&mut self, d: Dispatch<(), Batch>) {
        // On a broken stream the send is lost; the batch fails at the reconnect.
        let _ = self
            .stream
            .0
            .try_send(d.batch.iter().map(|w| w.0).collect());
        self.in_flight.push_back((d.credit, d.batch));
    }
    fn sent(&mut self, d: Option<Dispatch<(), Batch>>) {
        d.into_iter().for_each(|d| self.send(d));
    }
    /// Ends the oldest batch in flight for all its writers, and completes its credit.
    fn end_oldest(&mut self, outcome: Result<(), &'static str>) {
        let (credit, batch) = self.in_flight.pop_front().expect("a batch in flight");
        for (n, reply) in batch {
            let _ = reply.send(outcome.map(|()| n));
        }
        let next = self.window.complete(credit).expect("a live credit");
        self.sent(next);
    }
    fn add(&mut self, reply: Reply) {
        if let Some(parked) = self.window.reclaim() {
            self.open = parked; // no credit yet: the open batch keeps growing
        }
        self.open.push((self.arrived, reply));
        self.arrived += 1;
        if self.open.len() == 8 {
            let d = self.window.submit(take(&mut self.open)).expect("open");
            self.sent(d);
        }
    }
    /// After a burst of writes: the open batch leaves if there is credit, else parks.
    fn flush(&mut self) {
        if !self.open.is_empty() {
            let d = self
                .window
                .submit_or_park(take(&mut self.open))
                .expect("open");
            self.sent(d);
        }
    }
}

async fn run_shard(mut writes: mpsc::Receiver<Reply>, log: Log) -> (usize, u32) {
    let window = SingleWindow::limited(NonZeroUsize::new(4).expect("4 > 0"));
    let stream = connect(Some(2), Arc::clone(&log));
    let mut s = Shard {
        window,
        open: Vec::new(),
        arrived: 0,
        stream,
        in_flight: VecDeque::new(),
    };
    let (mut reconnects, mut peak) = (0, 0);
    while !s.window.is_drained() {
        tokio::select! {
            w = writes.recv(), if !s.window.is_closed() => match w {
                Some(reply) => {
                    s.add(reply);
                    while let Ok(reply) = writes.try_recv() {
                        s.add(reply);
                    }
                    s.flush();
                }
                None => {
                    s.flush();
                    let (queued, parked) = (s.window.queued(), s.window.is_parked());
                    println!("writers done: draining {queued} queued batches (open one parked: {parked})");
                    s.window.drain(); // refuse new batches, keep sending the held ones
                }
            },
            answer = s.stream.1.recv() => match answer {
                Some(()) => s.end_oldest(Ok(())),
                None => {
                    // Broken: the batches in flight fail, and each completed credit hands a
                    // held batch on, to the new stream (behind them in `in_flight`).
                    reconnects += 1;
                    println!("stream broke with {} batches in flight: reconnecting", s.in_flight.len());
                    s.stream = connect(None, Arc::clone(&log));
                    for _ in 0..s.in_flight.len() {
                        s.end_oldest(Err("stream broke"));
                    }
                }
            },
        }
        // The credit accounting is exact: one live credit per batch on the stream.
        assert_eq!(s.window.in_flight() as usize, s.in_flight.len());
        peak = peak.max(s.window.in_flight());
    }
    (reconnects, peak)
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let log = Log::default();
    let (writes, rx) = mpsc::channel(1024);
    let shard = tokio::spawn(run_shard(rx, Arc::clone(&log)));
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let writes = writes.clone();
            tokio::spawn(async move {
                let mut replies = Vec::new();
                for i in 0..50 {
                    let (reply, rx) = oneshot::channel();
                    writes.send(reply).await.expect("shard alive");
                    replies.push(rx);
                    if i % 5 == 4 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                drop(writes); // done writing: the shard drains once every writer is
                let mut acked = 0;
                for rx in replies {
                    acked += usize::from(rx.await.expect("every write ends").is_ok());
                }
                acked
            })
        })
        .collect();
    drop(writes);
    let all = async {
        let mut acked = 0;
        for w in writers {
            acked += w.await.expect("writer");
        }
        (acked, shard.await.expect("shard"))
    };
    // Paused time: a stranded batch fails this at once, not after 10 real seconds.
    let stranded = "stranded: writes pending after 10 s";
    let (acked, (reconnects, peak)) = tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .expect(stranded);
    let failed = 200 - acked;
    let log = log.lock().expect("log");
    println!("{acked} acked, {failed} failed by {reconnects} reconnect, at most {peak} in flight");
    assert!(reconnects == 1 && failed > 0 && peak == 4);
    assert_eq!(log.len(), acked, "the server applied each acked write once");
    assert!(log.windows(2).all(|w| w[0] < w[1]), "in arrival order");
}
