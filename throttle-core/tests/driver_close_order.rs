//! The std `BatchDriver`'s two closes keep submission order: the failing close fails the oldest
//! operations first, and the draining close in `SendOrder::PerShard` mode sends every shard's
//! operations in the order they were submitted.

#![cfg(feature = "std")]
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::task::Wake;
use throttle_sansio::sync::{BatchDriver, BatchOutcome, ManualClock, OpError, Runtime};
use throttle_sansio::{BatcherConfig, Instant, WindowConfig};

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;
#[derive(Clone, Default)]
struct Tiny {
    clock: ManualClock,
    tasks: Arc<Mutex<Vec<Task>>>,
}
impl Runtime for Tiny {
    fn now(&self) -> Instant {
        self.clock.now()
    }
    fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + 'static {
        self.clock.sleep_until(at)
    }
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, f: F) {
        self.tasks.lock().unwrap().push(Box::pin(f));
    }
}
impl Tiny {
    fn run_tasks(&self) {
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..5 {
            let tasks = core::mem::take(&mut *self.tasks.lock().unwrap());
            for mut t in tasks {
                if t.as_mut().poll(&mut cx).is_pending() {
                    self.tasks.lock().unwrap().push(t);
                }
            }
        }
    }
}
struct Rec(u32, Arc<Mutex<Vec<u32>>>);
impl Wake for Rec {
    fn wake(self: Arc<Self>) {
        self.1.lock().unwrap().push(self.0);
    }
}

#[test]
fn close_fails_in_arrival_order() {
    let rt = Tiny::default();
    let send = |_: &u8, ops: Vec<u32>| async move {
        let _ = ops;
        core::future::pending::<()>().await;
        let r: BatchOutcome<u32, std::io::Error> = Ok(vec![]);
        r
    };
    let cfg = BatcherConfig::reads()
        .with_window(WindowConfig::new(NonZeroUsize::MIN))
        .unwrap()
        .with_max_requests_per_batch(NonZeroUsize::MIN);
    let d: BatchDriver<_, _, u8, u32> = BatchDriver::new(rt.clone(), send, cfg);
    let mut futs: Vec<_> = (0..3).map(|k| Box::pin(d.submit(1, k))).collect();
    rt.run_tasks(); // 0 sent, 1 and 2 held in the batcher
    futs.extend((3..5).map(|k| Box::pin(d.submit(1, k)))); // 3, 4 in the inbox
    let order = Arc::new(Mutex::new(Vec::new()));
    for (k, f) in futs.iter_mut().enumerate() {
        let w = Waker::from(Arc::new(Rec(k as u32, order.clone())));
        assert!(f.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
    }
    d.close();
    let got = order.lock().unwrap().clone();
    for f in futs.iter_mut().skip(1) {
        assert!(matches!(
            f.as_mut().poll(&mut Context::from_waker(Waker::noop())),
            Poll::Ready(Err(OpError::Closed))
        ));
    }
    assert_eq!(got, [1, 2, 3, 4], "closed results in arrival order");
}

/// Every batch the transport was handed: `(shard, operations)`.
type Sent = Vec<(u8, Vec<u32>)>;

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Sent>>);
impl throttle_sansio::sync::Transport<u8, u32> for Log {
    type Output = u32;
    type Error = std::io::Error;
    fn send(
        &self,
        shard: &u8,
        ops: Vec<u32>,
    ) -> impl Future<Output = BatchOutcome<u32, std::io::Error>> + Send + 'static {
        self.0.lock().unwrap().push((*shard, ops.clone()));
        // Answer only on the second poll, so batches pile up behind the window.
        let mut polled = false;
        core::future::poll_fn(move |cx| {
            if polled {
                Poll::Ready(Ok(ops.iter().map(|&o| Ok(o)).collect()))
            } else {
                polled = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
    }
}

#[test]
fn per_shard_drain_sends_everything_in_order() {
    use throttle_sansio::sync::SendOrder;
    let rt = Tiny::default();
    let log = Log::default();
    let cfg = BatcherConfig::writes()
        .with_window(WindowConfig::new(NonZeroUsize::new(2).unwrap()))
        .unwrap()
        .with_max_requests_per_batch(NonZeroUsize::new(3).unwrap());
    let d: BatchDriver<_, _, u8, u32> = BatchDriver::builder(rt.clone(), log.clone(), cfg)
        .with_send_order(SendOrder::PerShard)
        .build();
    let mut futs: Vec<_> = (0..10)
        .map(|k| (k, Box::pin(d.submit((k % 2) as u8, k))))
        .collect();
    rt.run_tasks();
    futs.extend((10..20).map(|k| (k, Box::pin(d.submit((k % 2) as u8, k)))));
    let mut drained = Box::pin(d.drain());
    assert!(matches!(
        Box::pin(d.submit(1, 99))
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop())),
        Poll::Ready(Err(OpError::Closed))
    ));
    let mut cx = Context::from_waker(Waker::noop());
    let mut done = false;
    for _ in 0..50 {
        rt.run_tasks();
        if drained.as_mut().poll(&mut cx).is_ready() {
            done = true;
            break;
        }
    }
    assert!(done, "drain resolved");
    for (k, f) in futs.iter_mut() {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(v)) => assert_eq!(v, *k),
            other => panic!("{k}: {other:?}"),
        }
    }
    let log = log.0.lock().unwrap().clone();
    for s in 0..2u8 {
        let ops: Vec<u32> = log
            .iter()
            .filter(|(sh, _)| *sh == s)
            .flat_map(|(_, o)| o.clone())
            .collect();
        let want: Vec<u32> = (0..20).filter(|k| (k % 2) as u8 == s).collect();
        assert_eq!(ops, want, "shard {s} in order; batches {log:?}");
    }
    // close after drain fails nothing more
    d.close();
}
