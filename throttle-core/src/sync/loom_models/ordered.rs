//! The per-shard send mode's hand-off (`SendOrder::PerShard`): a shard's lane task (sending,
//! finishing a batch, finding its lane empty and ending) races a submit whose batch the driver
//! task dispatches to the same shard, and the driver's close. The shard's batches reach the
//! transport in dispatch order, no batch is left in a lane without a task to send it (or a
//! wake for one), and no credit stays live.

use alloc::vec::Vec;
use core::future::Future;
use core::task::Poll;
use std::sync::{Arc as StdArc, Mutex as StdMutex};

use loom::thread;

use super::support::{echo, left_on_shard_1, reads_with_window, ready_at_once, settle_all};
use super::{Hand, join, settle};
use crate::sync::loom::{Arc, Mutex, lock};
use crate::sync::oneshot::{self, Sender};
use crate::sync::test_support::Sends;
use crate::sync::test_support::{Task, TestRuntime};
use crate::sync::{BatchDriver, BatchOutcome, OpError, SendOrder};
use crate::test_hasher::TestHasher;

type Reply = Sender<BatchOutcome<u32, &'static str>>;

/// The batches held in the transport, each with the reply that answers it.
type Held = StdArc<StdMutex<Vec<(Vec<u32>, Reply)>>>;

/// Records each batch as `send` is called, under a loom lock (so loom may switch threads
/// between a lane taking a batch and sending it); answers it at once (`hold: false`) or when
/// the model sends its reply.
#[derive(Clone)]
struct Stream {
    hold: bool,
    sent: Arc<Mutex<Vec<Vec<u32>>>>,
    replies: Held,
}

impl Stream {
    fn new(hold: bool) -> Self {
        Stream {
            hold,
            sent: Arc::new(Mutex::new(Vec::new())),
            replies: StdArc::default(),
        }
    }

    fn sent(&self) -> Vec<Vec<u32>> {
        lock(&self.sent).clone()
    }

    /// Answers every held batch, each operation with itself.
    fn answer_all(&self) {
        let held: Vec<_> = match self.replies.lock() {
            Ok(mut r) => r.drain(..).collect(),
            Err(_) => Vec::new(),
        };
        for (ops, reply) in held {
            reply.send(echo(ops));
        }
    }

    /// The transport's `send` (see [`Sends`]).
    fn send(
        &self,
        ops: Vec<u32>,
    ) -> impl Future<Output = BatchOutcome<u32, &'static str>> + Send + use<> {
        lock(&self.sent).push(ops.clone());
        let rx = self.hold.then(|| {
            let (tx, rx) = oneshot::channel();
            if let Ok(mut r) = self.replies.lock() {
                r.push((ops.clone(), tx));
            }
            rx
        });
        async move {
            match rx {
                Some(rx) => rx.await.unwrap_or(Err("dropped")),
                None => echo(ops),
            }
        }
    }
}

/// The tasks spawned since the last look, as hand-polled futures.
fn spawned(rt: &TestRuntime) -> Vec<Hand<Task>> {
    rt.take_spawned().into_iter().map(Hand::new).collect()
}

/// Answered at once: the lane task's first poll (on one thread) sends `[10]`, sees it
/// answered, and finds its lane empty and ends, or finds `[20]` there; meanwhile (main
/// thread) `20` is submitted and the driver task dispatches it, and any lane task that
/// spawns is polled at once; `close` runs on a third thread. `[20]`, if it goes, goes after
/// `[10]`, by the first lane or by a new one that started after the first ended.
#[test]
fn lane_ending_racing_a_dispatch_and_close_keeps_order_and_strands_nothing() {
    lane_racing_dispatch_and_close(false);
}

/// Held in the transport: the lane task is asleep with `[10]` in flight (no answer comes)
/// and is polled on one thread if it is woken, while `20` is dispatched to the same lane
/// (main thread) and the driver closes (a third thread). The dispatch wakes the lane: once
/// every woken task has run, a dispatched `[20]` has been sent, after `[10]`, with `[10]`
/// still in flight.
#[test]
fn lane_asleep_racing_a_dispatch_and_close_is_woken_and_keeps_order() {
    lane_racing_dispatch_and_close(true);
}

fn lane_racing_dispatch_and_close(hold: bool) {
    super::model(move || {
        let rt = TestRuntime::new();
        let stream = Stream::new(hold);
        let transport = stream.clone();
        let transport = Sends::new(move |ops| transport.send(ops));
        let driver = BatchDriver::builder(rt.clone(), transport, reads_with_window(2))
            .with_send_order(SendOrder::PerShard)
            .with_hasher(TestHasher::default())
            .build();
        let mut tasks = spawned(&rt);
        let mut task = match tasks.pop() {
            Some(t) if tasks.is_empty() => t,
            _ => panic!("expected the driver task alone"),
        };
        assert!(task.poll().is_pending());
        let mut first = Hand::new(driver.submit(1, 10));
        assert!(first.poll().is_pending());
        assert!(task.poll().is_pending(), "the driver task dispatched [10]");
        let mut lane = match spawned(&rt).pop() {
            Some(lane) => lane,
            None => panic!("no lane task for shard 1"),
        };
        if hold {
            assert!(lane.poll().is_pending(), "[10] in flight");
            assert_eq!(stream.sent(), [[10]]);
        }

        let answers = stream.clone();
        let t1 = thread::spawn(move || {
            if !hold {
                answers.answer_all();
            }
            if lane.woken() && lane.poll().is_ready() {
                return None;
            }
            Some(lane)
        });
        let d2 = driver.clone();
        let t2 = thread::spawn(move || d2.close());
        let mut second = Hand::new(driver.submit(1, 20));
        let _ = second.poll();
        let driver_task = task.poll().is_pending().then_some(task);
        let mut started = spawned(&rt);
        started.retain_mut(|lane| lane.poll().is_pending());
        let first_lane = join(t1);
        join(t2);

        tasks.extend(first_lane);
        tasks.extend(started);
        tasks.extend(driver_task);
        settle(&rt, &mut tasks);
        let sent = stream.sent();
        assert!(
            sent == [alloc::vec![10]] || sent == [alloc::vec![10], alloc::vec![20]],
            "shard 1's batches out of dispatch order: {sent:?}"
        );
        // Every woken task has run: a dispatched [20] has been sent; answered at once, nothing
        // is in flight; held, every batch sent is.
        let live = driver.in_flight(&1) as usize;
        let expected = if hold { sent.len() } else { 0 };
        assert_eq!(
            live, expected,
            "a dispatched batch sits in its lane unsent (lost wake-up), or a credit is stranded"
        );
        stream.answer_all();
        settle_all(&rt, &mut tasks, "a driver or lane task was left pending");
        assert!(matches!(first.poll(), Poll::Ready(Ok(10))));
        let late = second.poll();
        match (&late, sent.len()) {
            (Poll::Ready(Ok(20)), 2) | (Poll::Ready(Err(OpError::Closed)), 1) => {}
            _ => panic!("20 lost or answered wrongly: {late:?} after {sent:?}"),
        }
        assert_eq!(left_on_shard_1(&driver), (0, 0, 0), "nothing stranded");
        assert_eq!(driver.slots_in_use(), 0, "a slot left behind");
        assert!(ready_at_once(driver.closed()));
    });
}
