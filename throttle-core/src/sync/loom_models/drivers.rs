//! The drivers: a batch's end racing the driver's close, a dropped `Submit` racing its batch
//! leaving, a connect racing the pool's close, and a cancelled refresher racing a call that joins its refresh. Their spawned tasks are
//! taken from the [`TestRuntime`]'s queue and polled on the thread each model gives them.

use alloc::vec::Vec;
use core::task::Poll;
use std::sync::Arc as StdArc;

use loom::thread;
use loom::thread::JoinHandle;

use super::support::{
    Batch, delivered_once_closed, echoing, ends_at_once, left_on_shard_1, reads_with_window,
    ready_at_once, resolved, settle_all, spawned_one, woken_and_ready,
};
use super::{Hand, boxed, join, settle};
use crate::batcher::BatcherConfig;
use crate::conn_key::{ConnConfig, ConnKey};
use crate::failover::{AdminWriteGateway, CallConfig, ErrorKind, Unlimited};
use crate::sync::loom::atomic::{AtomicUsize, Ordering};
use crate::sync::test_support::{FakeConnector, Sends, Task, TestRuntime, failing_once};
use crate::sync::{
    BatchDriver, BatchOutcome, ConnPool, FailoverExecutor, OpError, PoolError, Submit, Transport,
};
use crate::test_hasher::TestHasher;

/// A submitter of the batch models, polled by hand.
type Submitted = Hand<Submit<u32, &'static str>>;

/// The driver task, polled (it waits for work), then `10` submitted on shard 1 and polled,
/// and the driver task polled again, which dispatched it: the driver task, the submitter, and
/// the send task of the batch `[10]`, in the transport, not yet polled.
fn in_transport<T>(rt: &TestRuntime, driver: &Batch<T>) -> (Hand<Task>, Submitted, Task)
where
    T: Transport<u32, u32, Output = u32, Error = &'static str>,
{
    let mut task = Hand::new(spawned_one(rt));
    assert!(task.poll().is_pending(), "the driver task waits for work");
    let mut first = Hand::new(driver.submit(1, 10));
    assert!(first.poll().is_pending());
    assert!(task.poll().is_pending());
    (task, first, spawned_one(rt))
}

/// A thread that closes the driver: with `drain` (`drains`, the draining close) or `close`.
fn close_or_drain<T: Transport<u32, u32>>(driver: &Batch<T>, drains: bool) -> JoinHandle<()> {
    let d2 = driver.clone();
    thread::spawn(move || {
        if drains {
            drop(d2.drain()); // it drains at the call
        } else {
            d2.close();
        }
    })
}

/// A batch's end (`finish`, in its send task on one thread) races `close` (on another) while
/// the next operation is parked behind the full window and `closed()` is polled. The batch
/// in the transport delivers its result; the parked operation either rides the next batch
/// (the end came first) or fails with `Closed`, and is never dropped unanswered; the driver
/// task ends; no credit stays live; a `closed()` that was waiting resolves once the last
/// batch has ended and delivered, and not before.
#[test]
fn batch_finish_racing_close_answers_every_operation_and_drains() {
    batch_finish_racing_close(true, false, false);
}

/// As the first, with `drain` (the draining close) in place of `close`: the parked operation
/// is never failed, it rides the batch the end's credit sends (whichever of the two comes
/// first), and `closed()` waits for that batch too.
#[test]
fn batch_finish_racing_drain_sends_the_parked_operation() {
    batch_finish_racing_close(true, false, true);
}

/// As above, with nothing parked (the batch in the transport is the last), and a second
/// `closed()` first polled during the race: neither may resolve before that batch's result is
/// delivered. Both can today: `finish` decides "closed and drained" under the lock and
/// delivers the results after unlocking, so a `close` or a first poll of `closed()` that comes
/// in between sees the driver drained while a submitter is still unanswered. (With an
/// operation parked, as above, the end hands the credit to the parked batch, so the driver is
/// not drained yet and the waiting `closed()` is safe.)
#[test]
fn batch_closed_resolves_only_after_the_last_batch_delivers() {
    batch_finish_racing_close(false, true, false);
}

/// The batch model. `parked`: a second operation waits behind the full window; `fresh`: also
/// poll a `closed()` for the first time during the race; `drains`: `drain` instead of `close`.
fn batch_finish_racing_close(parked: bool, fresh: bool, drains: bool) {
    super::model(move || {
        let rt = TestRuntime::new();
        let echo = Sends::new(echoing);
        let driver = BatchDriver::with_hasher(
            rt.clone(),
            echo,
            reads_with_window(1),
            TestHasher::default(),
        );
        let (mut task, mut first, send) = in_transport(&rt, &driver);
        let mut second = parked.then(|| Hand::new(driver.submit(1, 20)));
        if let Some(second) = &mut second {
            assert!(second.poll().is_pending());
            assert!(task.poll().is_pending());
            assert_eq!(driver.open_ops(&1), 1, "20 is parked");
        }
        assert_eq!(driver.in_flight(&1), 1);
        let mut closed = Hand::new(boxed(driver.closed()));
        assert!(closed.poll().is_pending());

        let t1 = thread::spawn(move || ends_at_once(send, "the send task ends at once"));
        let t2 = close_or_drain(&driver, drains);
        let early = closed.poll();
        let fresh_ready = fresh && ready_at_once(driver.closed());
        // Once `closed()` resolves, the batch that was in the transport has ended and
        // delivered its result.
        let delivered = delivered_once_closed(
            early.is_ready() || fresh_ready,
            || driver.is_closed() && driver.in_flight(&1) == 0,
            "closed() resolved with a batch in the transport",
            &mut first,
            "closed() resolved before the last batch delivered",
        );
        join(t1);
        join(t2);

        // The driver task (woken by the close) and a second send task, if the end came
        // first and sent the parked batch.
        let mut tasks = alloc::vec![task];
        settle_all(&rt, &mut tasks, "a driver or send task was left pending");

        assert!(first.wakes() >= 1, "the submitter was left unwoken");
        let result = delivered.unwrap_or_else(|| first.poll());
        assert!(
            matches!(result, Poll::Ready(Ok(10))),
            "the sent batch's result lost"
        );
        if let Some(second) = &mut second {
            assert!(second.wakes() >= 1, "the parked submitter was left unwoken");
            let got = second.poll();
            assert!(
                matches!(got, Poll::Ready(Ok(20) | Err(OpError::Closed))),
                "the parked operation was dropped unanswered"
            );
            assert!(
                !drains || matches!(got, Poll::Ready(Ok(20))),
                "drain failed the parked operation"
            );
        }
        if early.is_pending() {
            woken_and_ready(&mut closed, "closed() pending after the last batch");
        }
        assert_eq!(left_on_shard_1(&driver), (0, 0, 0));
        let mut late = Hand::new(driver.submit(1, 30));
        assert!(matches!(late.poll(), Poll::Ready(Err(OpError::Closed))));
    });
}

/// Tears every batch: its send fails at once with an error the transport
/// ([`Sends::tearing`]) classes as a torn stream.
fn tear(_ops: Vec<u32>) -> core::future::Ready<BatchOutcome<u32, &'static str>> {
    core::future::ready(Err("torn"))
}

/// A torn batch's end (its send task, on one thread: the requeue at the head of the shard and
/// the pause) races `close` or `drain` (on another). With one reconnect attempt allowed, the
/// requeued batch is either failed by the close (`Closed`), or, draining, resent after the
/// 10 ms pause and, torn again with the backoff spent, failed with the transport's error; a
/// close that comes first makes the requeue fail the batch. Each way the operation resolves
/// exactly once, no credit, slot or queued entry is left, every task ends (the driver task
/// once its resume timer and the resend are done) and `closed()` resolves.
#[test]
fn batch_torn_end_racing_close_or_drain_resolves_the_requeued_operation_once() {
    for drains in [false, true] {
        super::model(move || {
            let rt = TestRuntime::new();
            let cfg = reads_with_window(1);
            let reconnect = crate::backoff::BackoffConfig::builder()
                .initial(core::time::Duration::from_millis(10))
                .jitter(crate::backoff::Jitter::None)
                .max_attempts(Some(1))
                .build()
                .unwrap();
            let driver = BatchDriver::builder(rt.clone(), Sends::tearing(tear), cfg)
                .with_hasher(TestHasher::default())
                .with_requeue(reconnect)
                .build();
            // The batch [10], about to tear.
            let (task, mut op, send) = in_transport(&rt, &driver);

            let t1 = thread::spawn(move || ends_at_once(send, "the send task ends at once"));
            let t2 = close_or_drain(&driver, drains);
            join(t1);
            join(t2);

            let mut tasks = alloc::vec![task];
            settle(&rt, &mut tasks);
            // The pause ends: a requeued batch is resent (and tears again).
            rt.clock.advance(core::time::Duration::from_millis(10));
            settle_all(&rt, &mut tasks, "a driver or send task was left pending");

            assert!(op.wakes() >= 1, "the submitter was left unwoken");
            match op.poll() {
                Poll::Ready(Err(OpError::Closed)) => assert!(!drains, "drain failed it Closed"),
                Poll::Ready(Err(OpError::Batch(f))) => assert_eq!(*f, "torn"),
                other => panic!(
                    "the operation was not resolved once: {:?}",
                    other.is_ready()
                ),
            }
            assert_eq!(left_on_shard_1(&driver), (0, 0, 0));
            assert_eq!(driver.slots_in_use(), 0, "a slot left behind");
            assert!(
                ready_at_once(driver.closed()),
                "closed() pending with nothing live"
            );
        });
    }
}

/// The leaser models' pool type: over [`FakeConnector`], whose connects succeed at once.
type Pool = ConnPool<TestRuntime, FakeConnector, u32, u32, TestHasher>;

/// A connect's end (its task on one thread) races the pool's `close` (on another) while the
/// leaser that opened it, and `closed()`, are polled on the main thread. The leaser is woken
/// and resolves (a lease if the connect won, `Closed` otherwise); no connection outlives the
/// close and the last lease (a connect that ends after the close drops its connection); a
/// `closed()` that was waiting resolves once the connect task has reported and no connection
/// is left, and not before.
#[test]
fn pool_connect_racing_close_leaves_no_connection_and_drains() {
    pool_connect_racing_close(false);
}

/// As above, with a second `closed()` first polled during the race: it must not resolve while
/// a connection is still open either. It does today: the connection the close took out, or
/// the one a connect that ended after the close refused, is dropped after the lock, and a
/// `closed()` polled in between already sees the pool drained.
#[test]
fn pool_closed_first_polled_during_the_close_waits_for_the_connection_drop() {
    pool_connect_racing_close(true);
}

/// The pool model; `fresh`: also poll a `closed()` for the first time during the race.
fn pool_connect_racing_close(fresh: bool) {
    super::model(move || {
        let rt = TestRuntime::new();
        let (pool, live) = fake_pool(&rt);
        let key = ConnKey::new(0, 1, 9000);
        let mut lease = Hand::new(boxed(pool.lease(&key)));
        assert!(
            lease.poll().is_pending(),
            "the leaser waits for its connect"
        );
        let connect = spawned_one(&rt);
        let mut closed = Hand::new(boxed(pool.closed()));
        assert!(closed.poll().is_pending());

        let t1 = thread::spawn(move || ends_at_once(connect, "the connect task ends at once"));
        let p2 = pool.clone();
        let t2 = thread::spawn(move || p2.close());
        let early = lease.poll();
        let early_closed = closed.poll();
        let fresh_ready = fresh && ready_at_once(pool.closed());
        if early_closed.is_ready() || fresh_ready {
            assert_eq!(
                live.load(Ordering::SeqCst),
                0,
                "closed() resolved with a connection open"
            );
        }
        join(t1);
        join(t2);

        let outcome = resolved(
            early,
            &mut lease,
            "the leaser was left unwoken",
            "the leaser stayed pending",
        );
        match outcome {
            Ok(l) => {
                assert!(
                    early_closed.is_pending(),
                    "closed() resolved with a lease out"
                );
                drop(l);
            }
            Err(PoolError::Closed) => {}
            Err(e) => panic!("unexpected lease error: {e}"),
        }
        assert_eq!(
            live.load(Ordering::SeqCst),
            0,
            "a connection outlived the close"
        );
        if early_closed.is_pending() {
            woken_and_ready(&mut closed, "closed() pending with nothing running");
        }
        assert!(
            rt.take_spawned().is_empty(),
            "an unexpected task was spawned"
        );
    });
}

/// The driver task going to sleep (its poll finds the input queue empty and stores its
/// waker) races a `submit` on another thread: the task sees the operation at once or is woken
/// for it, and the operation goes out and is answered.
#[test]
fn batch_submit_racing_the_driver_task_sleep_loses_no_operation() {
    super::model(|| {
        let rt = TestRuntime::new();
        let driver = BatchDriver::with_hasher(
            rt.clone(),
            Sends::new(echoing),
            BatcherConfig::reads(),
            TestHasher::default(),
        );
        let mut task = Hand::new(spawned_one(&rt));
        let d1 = driver.clone();
        let t1 = thread::spawn(move || d1.submit(1, 10));
        assert!(task.poll().is_pending(), "the driver task ended");
        let mut op = Hand::new(join(t1));

        // Whatever the order, the task has sent the operation or is woken for it.
        let sent: Vec<Hand<Task>> = rt.take_spawned().into_iter().map(Hand::new).collect();
        assert!(
            !sent.is_empty() || task.woken(),
            "lost wake-up: the driver task sleeps with an operation queued"
        );
        let mut tasks = alloc::vec![task];
        tasks.extend(sent);
        settle(&rt, &mut tasks);
        assert!(
            matches!(op.poll(), Poll::Ready(Ok(10))),
            "the operation was not answered"
        );
        driver.close();
        settle_all(&rt, &mut tasks, "the driver task outlived the close");
        assert!(ready_at_once(driver.closed()));
    });
}

/// Answers every batch at once, each operation with its own value, and counts in `sent` the
/// operations it was sent.
fn counting(
    sent: StdArc<AtomicUsize>,
) -> Sends<impl Fn(Vec<u32>) -> core::future::Ready<BatchOutcome<u32, &'static str>>> {
    Sends::new(move |ops: Vec<u32>| {
        sent.fetch_add(ops.len(), Ordering::SeqCst);
        echoing(ops)
    })
}

/// A dropped `Submit` (issue 13: it withdraws its operation) racing the moment its batch
/// leaves: the end of the batch in flight handing the credit to the parked one (`parked`), or
/// the driver task taking the operation from its input queue and sending it. The operation is
/// either withdrawn (never sent) or sent once, never both and never lost: the transport saw it
/// exactly when a send task for it was spawned, and afterwards no credit, open operation or
/// queued entry is left, and the close drains.
#[test]
fn batch_dropped_submit_racing_its_batch_leaving_is_withdrawn_or_sent_once() {
    for parked in [true, false] {
        super::model(move || {
            let rt = TestRuntime::new();
            let cfg = reads_with_window(1);
            let sent = StdArc::new(AtomicUsize::new(0));
            let transport = counting(StdArc::clone(&sent));
            let driver =
                BatchDriver::with_hasher(rt.clone(), transport, cfg, TestHasher::default());
            let mut task = Hand::new(spawned_one(&rt));
            assert!(task.poll().is_pending());
            let mut first = Hand::new(driver.submit(1, 10));
            assert!(task.poll().is_pending());
            let send = spawned_one(&rt); // [10], in the transport
            let mut given_up = Hand::new(driver.submit(1, 20));
            assert!(given_up.poll().is_pending());
            let mut task = Some(task);
            let t1 = if parked {
                if let Some(t) = &mut task {
                    assert!(t.poll().is_pending());
                }
                assert_eq!(driver.open_ops(&1), 1, "20 is parked");
                thread::spawn(move || {
                    ends_at_once(send, "the send task ends at once");
                    None
                })
            } else {
                let mut send = Hand::new(send);
                assert!(send.poll().is_ready());
                // 20 is still in the input queue; the driver task takes it on t1.
                let mut t = task.take();
                thread::spawn(move || {
                    if let Some(t) = &mut t {
                        assert!(t.poll().is_pending());
                    }
                    t
                })
            };
            let t2 = thread::spawn(move || drop(given_up));
            let task = task.or(join(t1));
            join(t2);
            let mut tasks: Vec<Hand<Task>> = rt.take_spawned().into_iter().map(Hand::new).collect();
            let left = !tasks.is_empty();
            settle_all(&rt, &mut tasks, "a send task was left pending");
            let seen = sent.load(Ordering::SeqCst);
            assert_eq!(seen, 1 + usize::from(left), "20 sent iff its batch left");
            assert!(matches!(first.poll(), Poll::Ready(Ok(10))));
            assert_eq!(left_on_shard_1(&driver), (0, 0, 0), "nothing stranded");
            assert_eq!(driver.slots_in_use(), 0, "a slot left behind");
            driver.close();
            let mut tasks: Vec<Hand<Task>> = task.into_iter().collect();
            settle_all(&rt, &mut tasks, "the driver task outlived the close");
            assert!(ready_at_once(driver.closed()));
        });
    }
}

/// The pool of the leaser models, with a fake connector and its count of live connections.
fn fake_pool(rt: &TestRuntime) -> (Pool, StdArc<AtomicUsize>) {
    let fake = FakeConnector::default();
    let live = StdArc::clone(&fake.live);
    match Pool::with_hasher(
        rt.clone(),
        fake,
        ConnConfig::default(),
        TestHasher::default(),
    ) {
        Ok(p) => (p, live),
        Err(e) => panic!("valid config refused: {e}"),
    }
}

/// A second leaser of an endpoint that is still connecting routes (and finds it connecting)
/// while the connect ends on another thread: it reads the `connected` epoch before routing,
/// so it gets the connection at once or is woken for it; both leasers share the one
/// connection.
#[test]
fn pool_second_leaser_racing_the_connect_end_gets_the_connection() {
    super::model(|| {
        let rt = TestRuntime::new();
        let (pool, live) = fake_pool(&rt);
        let key = ConnKey::new(0, 1, 9000);
        let mut opener = Hand::new(boxed(pool.lease(&key)));
        assert!(
            opener.poll().is_pending(),
            "the opener waits for its connect"
        );
        let connect = spawned_one(&rt);

        let t1 = thread::spawn(move || ends_at_once(connect, "the connect task ends at once"));
        let mut second = Hand::new(boxed(pool.lease(&key)));
        let early = second.poll();
        join(t1);

        let served = |lease: &mut Hand<_>, early: Poll<_>, who: &str| match early {
            Poll::Ready(Ok(l)) => l,
            Poll::Ready(Err(e)) => panic!("{who}: {e}"),
            Poll::Pending => {
                assert!(
                    lease.wakes() >= 1,
                    "lost wake-up: {who} sleeps on a live connection"
                );
                match lease.poll() {
                    Poll::Ready(Ok(l)) => l,
                    _ => panic!("{who} woken but not served"),
                }
            }
        };
        let b = served(&mut second, early, "the second leaser");
        let a = served(&mut opener, Poll::Pending, "the opener");
        assert_eq!(a.id(), b.id(), "two connections for one endpoint");
        assert_eq!(live.load(Ordering::SeqCst), 1);
        drop((a, b));
        pool.close();
        assert_eq!(
            live.load(Ordering::SeqCst),
            0,
            "a connection outlived the close"
        );
        assert!(ready_at_once(pool.closed()));
    });
}

/// The pool's timer loop (`drive_timeouts`, asleep with nothing scheduled) races the end of
/// the last lease on another thread, which gives the connection an idle deadline (the drive
/// step sees `poll_timeout` move earlier and notifies the timer signal): the loop ends asleep
/// on that deadline, and closes the connection when the clock reaches it.
#[test]
fn pool_idle_deadline_racing_the_timer_loop_rearms_it() {
    super::model(|| {
        let rt = TestRuntime::new();
        let (pool, live) = fake_pool(&rt);
        let key = ConnKey::new(0, 1, 9000);
        let mut opener = Hand::new(boxed(pool.lease(&key)));
        assert!(opener.poll().is_pending());
        let mut connect = Hand::new(spawned_one(&rt));
        assert!(connect.poll().is_ready());
        let Poll::Ready(Ok(lease)) = opener.poll() else {
            panic!("the opener was not served");
        };
        let id = lease.id();
        let mut timer = Hand::new(boxed(pool.drive_timeouts()));
        assert!(timer.poll().is_pending());
        assert_eq!(pool.idle_deadline(id), None, "leased: no idle deadline");

        let t1 = thread::spawn(move || drop(lease));
        assert!(timer.poll().is_pending());
        join(t1);

        while timer.woken() {
            assert!(timer.poll().is_pending());
        }
        let Some(idle) = pool.idle_deadline(id) else {
            panic!("the connection has no idle deadline after its last lease");
        };
        assert_eq!(
            rt.clock.next_deadline(),
            Some(idle),
            "the timer loop sleeps past the idle deadline: the notify was lost"
        );
        rt.clock.advance_to(idle);
        assert!(timer.woken());
        assert!(timer.poll().is_pending(), "the timer loop runs forever");
        assert_eq!(
            live.load(Ordering::SeqCst),
            0,
            "the idle connection was not closed"
        );
        drop(timer);
        pool.close();
    });
}

type Fx = FailoverExecutor<TestRuntime, AdminWriteGateway, Unlimited>;

/// The refresher's call is dropped mid-refresh (its guard ends the refresh as failed) on one
/// thread while two other calls that need a refresh poll on the main thread and on a second
/// thread: each either joined the running refresh (and is released by the guard's drop) or
/// came after it and started its own; none is stranded, both retry and succeed, and no
/// refresh generation is left in flight.
#[test]
fn refresh_guard_dropped_racing_a_joiner_strands_no_call() {
    super::model(|| {
        let fx = match Fx::new(
            TestRuntime::new(),
            AdminWriteGateway,
            Unlimited,
            CallConfig::default(),
        ) {
            Ok(fx) => fx,
            Err(e) => panic!("valid config refused: {e}"),
        };
        let fa = fx.clone();
        let mut refresher = Hand::new(boxed(async move {
            fa.call(
                || async { Err::<u32, _>(ErrorKind::NotLeader) },
                core::future::pending::<bool>,
            )
            .await
        }));
        assert!(refresher.poll().is_pending());
        assert!(fx.is_refreshing());
        let mut b = Hand::new(boxed(failing_once(&fx)));
        let c = Hand::new(boxed(failing_once(&fx)));

        let t1 = thread::spawn(move || drop(refresher));
        let t2 = thread::spawn(move || {
            let mut c = c;
            let first = c.poll().map(|r| r.ok());
            (c, first)
        });
        let b_first = b.poll().map(|r| r.ok());
        join(t1);
        let (mut c, c_first) = join(t2);

        for (name, call, first) in [("b", &mut b, b_first), ("c", &mut c, c_first)] {
            let result = match first {
                Poll::Ready(r) => r,
                Poll::Pending => {
                    assert!(
                        call.wakes() >= 1,
                        "{name} joined the refresh and was stranded"
                    );
                    match call.poll() {
                        Poll::Ready(r) => r.ok(),
                        Poll::Pending => panic!("{name} woken but still pending"),
                    }
                }
            };
            assert_eq!(result, Some(1), "{name} did not retry after the refresh");
        }
        assert!(
            !fx.is_refreshing(),
            "a refresh generation was left in flight"
        );
        assert_eq!(
            fx.refresh_waiters(),
            0,
            "a joiner was left in the coalescer"
        );
        assert!((1..=3).contains(&fx.refreshes_started()));
    });
}
