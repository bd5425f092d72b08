//! User code that panics on cue, for the handles' and drivers' panic-safety tests (issue 12):
//! a key whose `Hash`, `Eq` and `Clone` can panic at any one call, a waker whose `wake`
//! panics, and [`sweep`], which runs an operation once per user call it makes, panicking at
//! each call in turn ([`sweep_caught`] for the drivers, which catch the panic themselves).
//!
//! The trap is per thread (each test runs on its own), so tests running side by side do not
//! spring each other's.

use alloc::string::String;
use alloc::vec::Vec;
use core::cell::Cell;
use core::hash::{Hash, Hasher};
use core::task::Waker;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc as StdArc;
use std::task::Wake;

use super::test_support::{CountingWaker, WakeCount};

/// A call into user code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    Hash,
    Eq,
    Clone,
}

/// The message of every panic the trap raises; any other panic is a real failure.
const CUE: &str = "panicked on cue";

#[derive(Clone, Copy, Default)]
struct Trap {
    /// User calls to let through before the next one panics; `None`: disarmed.
    left: Option<usize>,
    /// Where it sprang since it was armed.
    sprung: Option<Point>,
}

std::thread_local! {
    static TRAP: Cell<Trap> = const { Cell::new(Trap { left: None, sprung: None }) };
}

fn visit(point: Point) {
    let fire = TRAP.with(|t| {
        let mut trap = t.get();
        let fire = match trap.left {
            Some(0) => {
                trap = Trap {
                    left: None,
                    sprung: Some(point),
                };
                true
            }
            Some(n) => {
                trap.left = Some(n - 1);
                false
            }
            None => false,
        };
        t.set(trap);
        fire
    });
    if fire {
        panic!("{point:?} {CUE}");
    }
}

/// Makes the `n`-th user call on this thread from now on (0-based) panic.
pub(crate) fn arm(n: usize) {
    TRAP.with(|t| {
        t.set(Trap {
            left: Some(n),
            sprung: None,
        })
    });
}

/// Disarms the trap; where it sprang since [`arm`], if it did.
pub(crate) fn disarm() -> Option<Point> {
    TRAP.with(|t| t.replace(Trap::default()).sprung)
}

/// A shard or bucket key whose `Hash`, `Eq` and `Clone` are user code that panics on cue.
#[derive(Debug)]
pub(crate) struct TrapKey(pub(crate) u32);

impl Hash for TrapKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        visit(Point::Hash);
        self.0.hash(state);
    }
}

impl PartialEq for TrapKey {
    fn eq(&self, other: &Self) -> bool {
        visit(Point::Eq);
        self.0 == other.0
    }
}

impl Eq for TrapKey {}

impl Clone for TrapKey {
    fn clone(&self) -> Self {
        visit(Point::Clone);
        TrapKey(self.0)
    }
}

/// Whether a panic's payload is the trap's.
fn is_cue(payload: &(dyn core::any::Any + Send)) -> bool {
    payload
        .downcast_ref::<String>()
        .is_some_and(|m| m.ends_with(CUE))
}

/// Runs `run` with the trap set to spring at the `n`-th user call: `Ok` if `run` returned
/// without reaching it, `Err(point)` if it panicked there. Any other panic is resumed.
pub(crate) fn trapped<T>(n: usize, run: impl FnOnce() -> T) -> Result<T, Point> {
    arm(n);
    let outcome = catch_unwind(AssertUnwindSafe(run));
    let sprung = disarm();
    match (outcome, sprung) {
        (Ok(value), None) => Ok(value),
        (Err(payload), Some(point)) => {
            if !is_cue(&*payload) {
                resume_unwind(payload);
            }
            Err(point)
        }
        (Ok(_), Some(point)) => panic!("{point:?} panicked on cue, but the panic was swallowed"),
        (Err(payload), None) => resume_unwind(payload),
    }
}

/// Panics under the handle at every user call of `op`, one per run: for `n = 0, 1, …` it
/// builds a fresh fixture with `setup` (trap disarmed), runs `op` on it with the trap set at
/// the `n`-th user call, and hands the fixture to `check` with where `op` panicked (`None`
/// for the one run that completes, the last). Returns the points `op` reaches, in call order.
pub(crate) fn sweep<F>(
    setup: impl FnMut() -> F,
    mut op: impl FnMut(&mut F),
    check: impl FnMut(&mut F, Option<Point>),
) -> Vec<Point> {
    sweep_runs(setup, |n, fixture| trapped(n, || op(fixture)).err(), check)
}

/// [`sweep`] for the drivers, which catch their user code's panics themselves (the operation
/// fails with `Panicked`): `op` runs with the trap set at the `n`-th user call and must return
/// normally; a panic on cue that escapes it is a failure. `check` gets where the trap sprang
/// (`None` for the one run that completes without reaching it, the last). Returns the points
/// `op` reaches, in call order.
pub(crate) fn sweep_caught<F>(
    setup: impl FnMut() -> F,
    mut op: impl FnMut(&mut F),
    check: impl FnMut(&mut F, Option<Point>),
) -> Vec<Point> {
    sweep_runs(
        setup,
        |n, fixture| {
            arm(n);
            let outcome = catch_unwind(AssertUnwindSafe(|| op(fixture)));
            let sprung = disarm();
            if let Err(payload) = outcome {
                if !is_cue(&*payload) {
                    resume_unwind(payload);
                }
                panic!("{sprung:?} at user call {n} panicked through the driver");
            }
            sprung
        },
        check,
    )
}

/// The loop both sweeps share: run `n = 0, 1, …` on a fresh fixture, where `run` returns the
/// point the trap sprang at (`None`: the run completed, the last), then `check` it.
fn sweep_runs<F>(
    mut setup: impl FnMut() -> F,
    mut run: impl FnMut(usize, &mut F) -> Option<Point>,
    mut check: impl FnMut(&mut F, Option<Point>),
) -> Vec<Point> {
    let mut points = Vec::new();
    for n in 0.. {
        let mut fixture = setup();
        let sprung = run(n, &mut fixture);
        check(&mut fixture, sprung);
        match sprung {
            None => break,
            Some(point) => points.push(point),
        }
        assert!(
            n < 64,
            "an operation that keeps calling user code: {points:?}"
        );
    }
    points
}

/// A `closed()` future listened to: polled once with its own counting waker (it must be
/// pending), then `close` runs, and must return normally even when a waker it wakes panics.
/// Returns the future, its waker and its wake count, for the test to poll it again.
pub(crate) fn close_while_listened<F: core::future::Future>(
    closed: F,
    close: impl FnOnce(),
) -> (core::pin::Pin<alloc::boxed::Box<F>>, Waker, WakeCount) {
    let (waker, wakes) = CountingWaker::new();
    let mut closed = alloc::boxed::Box::pin(closed);
    assert!(super::test_support::poll_once(&mut closed, &waker).is_pending());
    assert!(
        catch_unwind(AssertUnwindSafe(close)).is_ok(),
        "close returns normally"
    );
    (closed, waker, wakes)
}

/// A waker that counts its wakes and then panics in every one of them.
pub(crate) struct PanickingWaker {
    counting: Waker,
}

impl PanickingWaker {
    /// The waker, and the count of wakes it was asked for (each of which panicked).
    #[allow(clippy::new_ret_no_self)]
    pub(crate) fn new() -> (Waker, WakeCount) {
        let (counting, count) = CountingWaker::new();
        (Waker::from(StdArc::new(PanickingWaker { counting })), count)
    }
}

impl Wake for PanickingWaker {
    fn wake(self: StdArc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &StdArc<Self>) {
        self.counting.wake_by_ref();
        panic!("a waker's wake {CUE}");
    }
}
