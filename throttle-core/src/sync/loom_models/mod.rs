//! loom models of the races in `sync`, one race per model, driving the production handles,
//! permits, futures and driver tasks (the shim in `sync/loom.rs` swaps `std::sync` for loom's).
//!
//! Run (as `.ci/run` does): `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p
//! throttle-sansio --features std --lib --release` (add the filter `loom_models` for these
//! alone; the gate's model lives at the bottom of `gate.rs`). `docs/sync.md` has the table of
//! models, what each proves, and the guard whose removal makes it fail.
//!
//! Bounds: at most three threads per model (the main thread and two spawned ones); further
//! waiters are futures polled by hand on the main thread with counting wakers; driver tasks
//! (a batch's send, a connect) are taken from [`TestRuntime`]'s spawn queue and polled on the
//! thread the model gives them. `WindowHandle::stats` exposes, for tests only, the count of
//! releases the window refused (a double release) and the peak credits in flight per shard.

mod bytes;
mod drivers;
mod events;
mod ordered;
mod signal;
mod support;
mod window;
mod writer;

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::future::Future;
use core::task::{Poll, Waker};
use std::sync::Arc as StdArc;
use std::sync::atomic::{AtomicUsize, Ordering};

use loom::thread::JoinHandle;

use super::test_support::{CountingWaker, Task, TestRuntime, WakeCount, poll_once};

/// `loom::model(f)`, counting the interleavings loom explored; prints the count with the
/// test's name (seen with `--nocapture`).
fn model<F: Fn() + Send + Sync + 'static>(f: F) {
    let runs = StdArc::new(AtomicUsize::new(0));
    let count = StdArc::clone(&runs);
    loom::model(move || {
        count.fetch_add(1, Ordering::Relaxed);
        f();
    });
    std::eprintln!(
        "{}: {} interleavings",
        std::thread::current().name().unwrap_or("loom model"),
        runs.load(Ordering::Relaxed)
    );
}

/// Joins a model thread, passing its panic on as the model's failure.
fn join<T>(t: JoinHandle<T>) -> T {
    match t.join() {
        Ok(v) => v,
        Err(_) => panic!("a model thread panicked"),
    }
}

/// A future polled by hand: its own counting waker, and the wake count it last saw.
struct Hand<F> {
    fut: F,
    waker: Waker,
    wakes: WakeCount,
    /// `usize::MAX` until the first poll, so a new future counts as woken.
    seen: usize,
}

impl<F: Future + Unpin> Hand<F> {
    fn new(fut: F) -> Self {
        let (waker, wakes) = CountingWaker::new();
        Hand {
            fut,
            waker,
            wakes,
            seen: usize::MAX,
        }
    }

    fn poll(&mut self) -> Poll<F::Output> {
        self.seen = self.wakes.wakes();
        poll_once(&mut self.fut, &self.waker)
    }

    /// Woken since its last poll (or never polled).
    fn woken(&self) -> bool {
        self.wakes.wakes() != self.seen
    }

    fn wakes(&self) -> usize {
        self.wakes.wakes()
    }
}

/// Polls every woken task, and every task spawned meanwhile, until none is woken; returns the
/// tasks still pending (they wait for something outside: a model that ends with any left
/// asserts it is empty).
fn settle(rt: &TestRuntime, tasks: &mut Vec<Hand<Task>>) {
    loop {
        tasks.extend(rt.take_spawned().into_iter().map(Hand::new));
        let mut progressed = false;
        tasks.retain_mut(|t| {
            if !t.woken() {
                return true;
            }
            progressed = true;
            t.poll().is_pending()
        });
        if !progressed {
            return;
        }
    }
}

/// The future in a box, so it is `Unpin` and can be polled by hand.
fn boxed<F: Future>(fut: F) -> core::pin::Pin<Box<F>> {
    Box::pin(fut)
}
