//! The scenarios, each generic over the [`Harness`].

use core::future::Future;
use core::pin::pin;
use core::task::Poll;
use core::time::Duration;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use throttle_sansio::backpressure::Signal;
use throttle_sansio::conn_key::{ConnConfig, ConnKey};
use throttle_sansio::failover::{AdminWriteGateway, CallConfig, ErrorKind, Unlimited};
use throttle_sansio::sync::{
    BatchDriver, BatchOutcome, Closed, ConnPool, Connector, FailoverExecutor, GateHandle, OpError,
    Runtime, Transport, WakeSignal, WindowHandle,
};
use throttle_sansio::{BatcherConfig, GateState, Instant, WindowConfig, WriteGateConfig};

use crate::harness::{Harness, until};

const MS: Duration = Duration::from_millis(1);

/// Runs `a` until it ends or `b` does; `None` if `b` won (then `a` is dropped: cancelled).
async fn unless<A: Future, B: Future>(a: A, b: B) -> Option<A::Output> {
    let (mut a, mut b) = (pin!(a), pin!(b));
    core::future::poll_fn(|cx| {
        if let Poll::Ready(v) = a.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        if b.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

fn window(capacity: u32) -> WindowHandle<u32> {
    WindowHandle::new(WindowConfig::default().with_max_in_flight(capacity as usize)).unwrap()
}

pub async fn window_of_two_serves_five_submitters_in_arrival_order_never_more_than_two_at_once<
    H: Harness,
>(
    h: &H,
) {
    let rt = h.rt();
    let window = window(2);
    let order = Arc::new(Mutex::new(Vec::new()));
    let (holding, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    for i in 0..5 {
        let (w, rt2, arrived, holding, peak) = (
            window.clone(),
            rt.clone(),
            Arc::clone(&order),
            Arc::clone(&holding),
            Arc::clone(&peak),
        );
        rt.spawn(async move {
            let permit = w.acquire(7).await.unwrap();
            let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            arrived.lock().unwrap().push(i);
            // Submitter i holds its credit until (i + 1) * 10 ms: absolute, so a slow task cannot
            // push its own release past the scenario's next step, and one release per step, so
            // each step grants exactly one waiter (two grants at one instant would race to
            // `arrived` on a multi-threaded executor, and the test could not see the grant order).
            let release = 10 * (i as u64 + 1);
            rt2.sleep_until(Instant::from_millis(release)).await;
            holding.fetch_sub(1, Ordering::SeqCst);
            drop(permit);
        });
        // Arrival order is the order of first polls: wait for each to be in before the next.
        until(h, "submitter arrived", || {
            order.lock().unwrap().len() + window.waiting(&7) == i + 1
        })
        .await;
    }
    assert_eq!(*order.lock().unwrap(), [0, 1]);
    assert_eq!((window.in_flight(&7), window.waiting(&7)), (2, 3));
    for (served, label) in [(3, "2 served"), (4, "3 served"), (5, "4 served")] {
        h.advance(10 * MS).await;
        until(h, label, || order.lock().unwrap().len() == served).await;
        assert!(window.in_flight(&7) <= 2);
        assert_eq!(window.waiting(&7), 5 - served);
    }
    h.advance(20 * MS).await;
    until(h, "all released", || window.in_flight(&7) == 0).await;
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4], "FIFO");
    assert_eq!(peak.load(Ordering::SeqCst), 2, "never more than 2 at once");
    assert_eq!(window.available(&7), 2);
}

pub async fn cancelled_waiter_leaves_the_line_and_the_next_one_gets_the_credit<H: Harness>(h: &H) {
    let rt = h.rt();
    let window = window(1);
    let held = window.try_acquire(7).unwrap();
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    for (name, give_up_at) in [("a", Some(5)), ("b", None)] {
        let (w, rt2, out) = (window.clone(), rt.clone(), Arc::clone(&outcomes));
        rt.spawn(async move {
            let acquire = w.acquire(7);
            let got = match give_up_at {
                // `a` gives up at 5 ms: its acquire future is dropped while it waits.
                Some(ms) => unless(acquire, rt2.sleep_until(Instant::from_millis(ms))).await,
                None => Some(acquire.await),
            };
            let got = got.map(|r| r.map(|permit| permit.credit()));
            out.lock()
                .unwrap()
                .push((name, got.is_some_and(|r| r.is_ok())));
        });
        until(h, "waiter in line", || {
            window.waiting(&7) == if name == "a" { 1 } else { 2 }
        })
        .await;
    }
    h.advance(5 * MS).await;
    until(h, "a gave up", || outcomes.lock().unwrap().len() == 1).await;
    assert_eq!(*outcomes.lock().unwrap(), [("a", false)]);
    assert_eq!(window.waiting(&7), 1, "a left the line; b still waits");
    drop(held);
    until(h, "b served", || outcomes.lock().unwrap().len() == 2).await;
    assert_eq!(*outcomes.lock().unwrap(), [("a", false), ("b", true)]);
    until(h, "b's permit released", || window.in_flight(&7) == 0).await;
    assert_eq!(
        window.available(&7),
        1,
        "the credit was neither lost nor doubled"
    );
}

/// Holds each batch until `release` is notified, then answers every op with its own value.
struct Held {
    release: WakeSignal,
    sent: Arc<Mutex<Vec<Vec<u32>>>>,
}

type Echo = BatchOutcome<u32, &'static str>;

impl Transport<u32, u32> for Held {
    type Error = &'static str;
    type Output = u32;
    fn send(&self, _: &u32, ops: Vec<u32>) -> impl Future<Output = Echo> + Send + 'static {
        self.sent.lock().unwrap().push(ops.clone());
        let answer: Echo = Ok(ops.into_iter().map(Ok).collect());
        let released = self.release.changed(0);
        async move {
            released.await;
            answer
        }
    }
}

pub async fn close_fails_waiters_and_held_batches_while_batches_in_flight_finish<H: Harness>(
    h: &H,
) {
    let rt = h.rt();
    // Window waiters.
    let window = window(1);
    let permit = window.try_acquire(7).unwrap();
    let waits = Arc::new(Mutex::new(Vec::new()));
    for _ in 0..2 {
        let (w, out) = (window.clone(), Arc::clone(&waits));
        rt.spawn(async move {
            let r = w.acquire(7).await.map(|_| ());
            out.lock().unwrap().push(r);
        });
    }
    until(h, "two waiters", || window.waiting(&7) == 2).await;
    window.close();
    until(h, "waiters failed", || waits.lock().unwrap().len() == 2).await;
    assert_eq!(*waits.lock().unwrap(), [Err(Closed), Err(Closed)]);
    drop(permit); // a held permit still releases after close

    // Batch driver: one batch in flight, one held (parked) behind the window of 1.
    let release = WakeSignal::new();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let transport = Held {
        release: release.clone(),
        sent: Arc::clone(&sent),
    };
    let cfg = BatcherConfig::reads()
        .with_window(WindowConfig::default().with_max_in_flight(1))
        .unwrap();
    let driver: BatchDriver<_, _, u32, u32> = BatchDriver::new(rt.clone(), transport, cfg);
    let results = Arc::new(Mutex::new(Vec::new()));
    let submit = |op: u32| {
        let (fut, out) = (driver.submit(1, op), Arc::clone(&results));
        rt.spawn(async move {
            let r = fut.await;
            out.lock().unwrap().push((op, r));
        });
    };
    submit(10);
    until(h, "first batch sent", || sent.lock().unwrap().len() == 1).await;
    submit(11);
    submit(12);
    until(h, "held batch parked", || driver.open_ops(&1) == 2).await;
    driver.close();
    until(h, "held ops failed", || results.lock().unwrap().len() == 2).await;
    release.notify();
    until(h, "in-flight batch done", || {
        results.lock().unwrap().len() == 3
    })
    .await;
    let mut got = std::mem::take(&mut *results.lock().unwrap());
    got.sort_by_key(|(op, _)| *op);
    assert!(matches!(got[0], (10, Ok(10))), "{:?}", got[0]);
    assert!(matches!(got[1], (11, Err(OpError::Closed))));
    assert!(matches!(got[2], (12, Err(OpError::Closed))));
    assert_eq!(
        *sent.lock().unwrap(),
        [vec![10]],
        "nothing sent after close"
    );
    assert!(matches!(driver.submit(1, 13).await, Err(OpError::Closed)));
}

pub async fn gate_opens_early_when_a_lower_pressure_arrives<H: Harness>(h: &H) {
    let rt = h.rt();
    let gate: GateHandle<u32> =
        GateHandle::new(WriteGateConfig::fluss_issue_3454()).expect("the config is valid");
    // Full pressure: issue #3454's ceiling, 5000 ms.
    assert_eq!(gate.handle_kv_signal(rt.now(), &7, Signal::Full), 5000 * MS);
    let opened = Arc::new(Mutex::new(None));
    let (g, rt2, out) = (gate.clone(), rt.clone(), Arc::clone(&opened));
    rt.spawn(async move {
        let state = g.wait_until_open(&rt2, &7).await;
        *out.lock().unwrap() = Some((state, rt2.now()));
    });
    h.advance(100 * MS).await;
    assert!(opened.lock().unwrap().is_none());
    // Half pressure: 5000 ms × 0.5³ = 625 ms from now (latest wins, and it emits a Wake).
    assert_eq!(
        gate.handle_kv_signal(rt.now(), &7, Signal::Pressure(500_000)),
        625 * MS
    );
    h.advance(624 * MS).await;
    assert!(
        opened.lock().unwrap().is_none(),
        "not before the new opening"
    );
    h.advance(MS).await;
    until(h, "opened", || opened.lock().unwrap().is_some()).await;
    assert_eq!(
        *opened.lock().unwrap(),
        Some((GateState::Open, Instant::from_millis(725))),
        "at the new opening, 4.3 s before the old one"
    );
}

/// An in-memory connector; its connections are `Arc` clones of one counter, so the counter's
/// strong count less the test's and the connector's is the number of connections alive.
pub struct Memory(pub Arc<()>);

impl Connector<u32> for Memory {
    type Error = ();
    type Conn = Arc<()>;
    fn connect(
        &self,
        _: &u32,
        _: u16,
        _attempt: throttle_sansio::conn_key::ConnectAttempt,
    ) -> impl Future<Output = Result<Arc<()>, ()>> + Send + 'static {
        core::future::ready(Ok(Arc::clone(&self.0)))
    }
}

pub async fn idle_connection_is_closed_after_max_idle<H: Harness>(h: &H) {
    let rt = h.rt();
    let counter = Arc::new(());
    let live = || Arc::strong_count(&counter) - 2;
    let cfg = ConnConfig::default().with_max_idle(Duration::from_secs(10));
    let pool: ConnPool<_, _, u32, u32> =
        ConnPool::new(rt.clone(), Memory(Arc::clone(&counter)), cfg).unwrap();
    let p = pool.clone();
    rt.spawn(async move { p.drive_timeouts().await });
    let key = ConnKey::new(0, 1, 9123);
    let lease = pool.lease(&key).await.unwrap();
    let id = lease.id();
    assert_eq!((pool.len(), live()), (1, 1));
    h.advance(Duration::from_secs(60)).await;
    assert_eq!(pool.len(), 1, "a leased connection is never idle");
    drop(lease);
    assert_eq!(
        pool.idle_deadline(id),
        Some(Instant::from_millis(70_000)),
        "idle from the lease's end"
    );
    h.advance(Duration::from_millis(9_999)).await;
    assert_eq!(pool.len(), 1);
    h.advance(MS).await;
    until(h, "idle connection closed", || {
        pool.is_empty() && live() == 0
    })
    .await;
    assert_eq!(pool.connection(&key), None);
}

pub async fn eight_concurrent_failures_share_one_refresh<H: Harness>(h: &H) {
    let rt = h.rt();
    let fx = FailoverExecutor::new(
        rt.clone(),
        AdminWriteGateway,
        Unlimited,
        CallConfig::default(),
    )
    .unwrap();
    let leader_moved = Arc::new(AtomicUsize::new(0));
    let (sends, refreshes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let refreshed = WakeSignal::new();
    let done = Arc::new(Mutex::new(Vec::new()));
    for i in 0..8u32 {
        let (fx, leader, sends, refreshes, refreshed, done) = (
            fx.clone(),
            Arc::clone(&leader_moved),
            Arc::clone(&sends),
            Arc::clone(&refreshes),
            refreshed.clone(),
            Arc::clone(&done),
        );
        rt.spawn(async move {
            let out = fx
                .call(
                    || {
                        sends.fetch_add(1, Ordering::SeqCst);
                        let moved = leader.load(Ordering::SeqCst) == 1;
                        async move {
                            if moved {
                                Ok(i)
                            } else {
                                Err(ErrorKind::NotLeader)
                            }
                        }
                    },
                    || {
                        refreshes.fetch_add(1, Ordering::SeqCst);
                        let (changed, leader) = (refreshed.changed(0), Arc::clone(&leader));
                        async move {
                            changed.await; // the metadata lookup ends when the test says
                            leader.store(1, Ordering::SeqCst);
                            true
                        }
                    },
                )
                .await;
            done.lock().unwrap().push(out);
        });
    }
    until(h, "eight failures", || sends.load(Ordering::SeqCst) == 8).await;
    until(h, "all eight joined the refresh", || {
        fx.refresh_waiters() == 8
    })
    .await;
    refreshed.notify();
    until(h, "all done", || done.lock().unwrap().len() == 8).await;
    assert_eq!(refreshes.load(Ordering::SeqCst), 1, "one coalesced refresh");
    assert_eq!(fx.refreshes_started(), 1);
    assert_eq!(
        sends.load(Ordering::SeqCst),
        16,
        "each retried once on the new leader"
    );
    let mut ok: Vec<u32> = done
        .lock()
        .unwrap()
        .iter()
        .map(|r| *r.as_ref().unwrap())
        .collect();
    ok.sort_unstable();
    assert_eq!(ok, (0..8).collect::<Vec<_>>());
}
