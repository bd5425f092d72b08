//! The fixtures and end-of-race checks several models share: waiters put in line and polled
//! with nothing else done at a poll, the one task a step spawns, a transport made of a
//! closure, and the checks that follow a race (a wait served after its wake, a `closed()`
//! woken and ready, every task settled).
//!
//! Each helper does exactly what the models did inline before it: the same calls, in the
//! same order, with the same assertions and messages.

use alloc::vec::Vec;
use core::fmt::Display;
use core::future::Future;
use core::task::{Poll, Waker};

use super::{Hand, boxed, settle};
use crate::batcher::BatcherConfig;
use crate::dispatch_window::WindowConfig;
use crate::sync::test_support::{CountingWaker, Task, TestRuntime, WakeCount, poll_once};
use crate::sync::{BatchDriver, BatchOutcome, Transport};
use crate::test_hasher::TestHasher;

/// A future with its own counting waker, polled by hand with nothing else done at a poll (no
/// read of its wake count, unlike [`Hand`]), so that a poll in a race is the future's own step
/// alone.
pub(super) struct Waiter<F> {
    pub(super) fut: F,
    pub(super) waker: Waker,
    pub(super) wakes: WakeCount,
}

impl<F: Future + Unpin> Waiter<F> {
    pub(super) fn poll(&mut self) -> Poll<F::Output> {
        poll_once(&mut self.fut, &self.waker)
    }

    pub(super) fn wakes(&self) -> usize {
        self.wakes.wakes()
    }
}

/// `N` waiters, each made by `wait` with its own counting waker, then each polled once in that
/// order and found pending: a line, first made first served.
pub(super) fn in_line<F, const N: usize>(wait: impl Fn() -> F) -> [Waiter<F>; N]
where
    F: Future + Unpin,
{
    let mut line = core::array::from_fn(|_| {
        let (waker, wakes) = CountingWaker::new();
        Waiter {
            fut: wait(),
            waker,
            wakes,
        }
    });
    for waiter in &mut line {
        assert!(waiter.poll().is_pending());
    }
    line
}

/// The waiter that a release passed `what` (the credit, the bytes) on to: woken exactly once,
/// and served by its next poll.
pub(super) fn woken_once_and_served<F, T, E>(waiter: &mut Waiter<F>, name: &str, what: &str) -> T
where
    F: Future<Output = Result<T, E>> + Unpin,
{
    assert_eq!(waiter.wakes(), 1, "{name} woken exactly once");
    let Poll::Ready(Ok(got)) = waiter.poll() else {
        panic!("the {what} did not reach {name}");
    };
    got
}

/// What a wait ends with whose poll in the race gave `first`: that, or, pending, it was woken
/// exactly once on `waker` (`lost` otherwise) and is served by its next poll with that waker
/// (`unserved` otherwise).
pub(super) fn served_now_or_after_one_wake<F, T, E>(
    first: Poll<Result<T, E>>,
    fut: &mut F,
    (waker, wakes): (&Waker, &WakeCount),
    lost: &str,
    unserved: &str,
) -> T
where
    F: Future<Output = Result<T, E>> + Unpin,
    E: Display,
{
    match first {
        Poll::Ready(Ok(got)) => got,
        Poll::Ready(Err(e)) => panic!("{e}"),
        Poll::Pending => {
            assert_eq!(wakes.wakes(), 1, "{lost}");
            match poll_once(fut, waker) {
                Poll::Ready(Ok(got)) => got,
                _ => panic!("{unserved}"),
            }
        }
    }
}

/// What a hand-polled future ends with whose poll in the race gave `early`: that, or, pending,
/// it was woken since (`unwoken` otherwise) and its next poll is ready (`stranded` otherwise).
pub(super) fn resolved<F: Future + Unpin>(
    early: Poll<F::Output>,
    fut: &mut Hand<F>,
    unwoken: &str,
    stranded: &str,
) -> F::Output {
    match early {
        Poll::Ready(r) => r,
        Poll::Pending => {
            assert!(fut.wakes() >= 1, "{unwoken}");
            match fut.poll() {
                Poll::Ready(r) => r,
                Poll::Pending => panic!("{stranded}"),
            }
        }
    }
}

/// A `closed()` that was pending in the race: it was woken since, and is ready now
/// (`pending` otherwise).
pub(super) fn woken_and_ready<F: Future + Unpin>(closed: &mut Hand<F>, pending: &str) {
    assert!(closed.wakes() >= 1, "lost wake-up: closed() never woken");
    assert!(closed.poll().is_ready(), "{pending}");
}

/// Once `closed()` resolved in the race (`resolved`), the driver must be closed with nothing
/// in flight (`drained`, `busy` otherwise) and the first operation's result delivered already
/// (its poll ready, `undelivered` otherwise): that result, kept for the end of the model.
pub(super) fn delivered_once_closed<F: Future + Unpin>(
    resolved: bool,
    drained: impl FnOnce() -> bool,
    busy: &str,
    first: &mut Hand<F>,
    undelivered: &str,
) -> Option<Poll<F::Output>> {
    if !resolved {
        return None;
    }
    assert!(drained(), "{busy}");
    let r = first.poll();
    assert!(r.is_ready(), "{undelivered}");
    Some(r)
}

/// A future that is ready at its first poll (a `closed()` with nothing live).
pub(super) fn ready_at_once<F: Future>(fut: F) -> bool {
    Hand::new(boxed(fut)).poll().is_ready()
}

/// The one task spawned since the last look.
pub(super) fn spawned_one(rt: &TestRuntime) -> Task {
    let mut tasks = rt.take_spawned();
    assert_eq!(tasks.len(), 1, "expected one spawned task");
    match tasks.pop() {
        Some(t) => t,
        None => panic!("no task spawned"),
    }
}

/// Polls a spawned task (a send, a connect) once, on the thread that calls it: it ends at
/// once (`msg` otherwise).
pub(super) fn ends_at_once(task: Task, msg: &str) {
    let mut task = Hand::new(task);
    assert!(task.poll().is_ready(), "{msg}");
}

/// [`settle`]s `tasks`: none is left pending (`msg` otherwise).
pub(super) fn settle_all(rt: &TestRuntime, tasks: &mut Vec<Hand<Task>>, msg: &str) {
    settle(rt, tasks);
    assert!(tasks.is_empty(), "{msg}");
}

/// The answer of a server that executes every operation of a batch: each its own value.
pub(super) fn echo(ops: Vec<u32>) -> BatchOutcome<u32, &'static str> {
    Ok(ops.into_iter().map(Ok).collect())
}

/// A send that [`echo`]es the batch at once: the future is ready at its first poll.
pub(super) fn echoing(ops: Vec<u32>) -> core::future::Ready<BatchOutcome<u32, &'static str>> {
    core::future::ready(echo(ops))
}

/// The batch driver of the models: runtime, transport, shard and operation all as the models
/// make them, the test hasher.
pub(super) type Batch<T> = BatchDriver<TestRuntime, T, u32, u32, TestHasher>;

/// Reads, with a window of `max_in_flight` credits a shard.
pub(super) fn reads_with_window(max_in_flight: usize) -> BatcherConfig {
    BatcherConfig::reads()
        .with_window(WindowConfig::default().with_max_in_flight(max_in_flight))
        .expect("a window above 0 is valid")
}

/// What shard 1 still holds, and the driver's input queue: credits in flight, open
/// operations, queued entries (`(0, 0, 0)` once everything is answered).
pub(super) fn left_on_shard_1<T: Transport<u32, u32>>(driver: &Batch<T>) -> (u32, usize, usize) {
    (driver.in_flight(&1), driver.open_ops(&1), driver.queued())
}
