//! The concurrent layer (feature `std`): cloneable handles over the sans-IO machines for many
//! tasks at once, waker-based async waiting, and [`Permit`], the only way to hold a window
//! credit.
//!
//! Written once here, with only `std::sync` (through a loom shim) and `core::task::Waker`, so
//! every runtime adapter reuses it; an adapter supplies just a [`Runtime`] (clock, sleep,
//! spawn).
//!
//! | handle | over | waits for |
//! |---|---|---|
//! | [`WindowHandle`] | [`DispatchWindow`](crate::DispatchWindow) | a shard's credit ([`Permit`]), FIFO per shard |
//! | [`PendingBytes`] | [`PendingBytesLimiter`](crate::PendingBytesLimiter) | admission of `n` bytes ([`BytesPermit`]), FIFO |
//! | [`GateHandle`] | [`WriteGate`](crate::WriteGate) + two [`WakeSignal`]s (bound to a [`Runtime`] or [`Unbound`]) | a bucket's opening ([`wait_until_open`](GateHandle::wait_until_open)), re-armed on every `Wake` |
//! | [`BatchDriver`] | [`Batcher`](crate::Batcher) + a user [`Transport`] | an operation's result ([`Submit`]), batched rate-adaptively |
//! | [`ConnPool`] | [`ConnTable`](crate::ConnTable) + a [`Connector`] | a connection ([`Lease`]); idle ones close at the table's deadlines |
//! | [`WriteDriver`] | [`PacedWriter`](crate::PacedWriter) + a user send closure and [`WriteClassifier`] | a record's result ([`Append`]); gated and probing buckets parked until their instant |
//! | [`FailoverExecutor`] | [`Call`](crate::Call), [`RefreshCoalescer`](crate::RefreshCoalescer), a [`RetryBudget`](crate::RetryBudget) | a request's end, with one coalesced refresh for concurrent failures |
//! | [`retry`] ([`Retry`]) | a [`Call`](crate::Call) with a backoff, a deadline and a [`SharedBudget`] | an operation's end, retried on the runtime's clock |
//! | [`WakeSignal`] + [`wait_until`] | any machine whose deadline can move earlier | its deadline, re-armed on every signal |
//!
//! Every handle follows the same rules:
//!
//! - One `std::sync::Mutex` per handle protects the machine and the waiters' table; every
//!   input is one critical section, so the machine's own guards (exactly-once release, FIFO
//!   tickets) hold across threads.
//! - Nothing is sent, woken or called back under the lock: wakers are collected inside the
//!   critical section and woken after the guard is dropped.
//! - Waiting futures join their line on their first poll, and are cancel-safe: dropping one at
//!   any point leaves the state as if it had never waited, except that a credit or grant
//!   already handed to it is passed on to the next waiter.
//! - Handles are `Clone + Send + Sync`; permits and futures are `Send` (asserted at compile
//!   time below).
//! - Hashers: std handles default to `RandomState`; core machines take `S`. A handle generic
//!   over a hasher (and its permit, future or lease) declares `S = std::hash::RandomState`;
//!   its `new` is defined for that hasher only (as `HashMap::new`), so
//!   `GateHandle::new(cfg)` needs no annotation; `with_hasher` takes any `S`. The machines
//!   under the handles keep `S` without a default.
//! - Time and randomness: a handle whose machine takes `now` or an RNG (the gate) is bound to
//!   a [`Runtime`] or [`Unbound`] (its type parameter `R`). Bound, its inputs read `now` from
//!   the runtime and draw from a per-client generator ([`client_rng`]); unbound (the default,
//!   for custom runtimes), they take both from the caller. The drivers take the runtime in
//!   `new`. `docs/architecture.md` ("API grammar") has the rule.
//! - User code that panics (a key's `Hash`, `Eq` or `Clone`, a waker's `clone`, the closure
//!   of [`GateHandle::update`]) panics out to the caller that supplied it, and the handle
//!   keeps serving: the window, bytes and signal handles make those calls before they change
//!   anything (or after a change the future's drop undoes), and the gate's closure is caught
//!   and followed through, so a poisoned lock is recovered, not propagated. A waker whose
//!   `wake` panics is the exception: the panic is caught and dropped, and every other waker
//!   is still woken. `docs/sync.md` ("User code that panics") lists each call and its test.
//! - A handle with `close()` has `closed().await`: it resolves once the handle is closed and
//!   everything it had in flight has ended (window: no live credit; bytes: nothing granted;
//!   pool: no lease out and no connect running; batch driver: no batch in the transport;
//!   failover executor: no call, and so no refresh, in flight).
//!   The release path that ends the last of them notifies a [`WakeSignal`]; nothing polls.
//!
//! The loom models (`loom_models`, `cfg(loom)`) check the races; see
//! `docs/sync.md` for the design and how to run them.

mod classify;
mod drive;
mod events;
mod gate;
mod host;
mod loom;
mod oneshot;
mod pending;
mod runtime;
mod seed;
mod signal;
#[cfg(all(feature = "tower", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;
#[cfg(all(feature = "tracing", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
pub mod trace;
mod unwind;
mod waiters;
mod window;

// The drivers, in `drivers/` (kept apart from the std layer's plumbing above; each module
// keeps its path in the tree, `sync::batch` and so on).
#[path = "drivers/batch.rs"]
mod batch;
#[path = "drivers/failover.rs"]
mod failover;
#[path = "drivers/pool.rs"]
mod pool;
#[path = "drivers/retry.rs"]
mod retry;
#[path = "drivers/writer.rs"]
mod writer;

#[cfg(test)]
pub(crate) mod test_support;

#[cfg(all(test, not(loom)))]
pub(crate) mod panic_support;

#[cfg(all(test, loom))]
mod loom_models;

pub(crate) use waiters::wake_all;

pub use batch::{
    BatchDriver, BatchDriverBuilder, BatchFailure, BatchOutcome, OpError, SendOrder, Submit,
    Transport,
};
pub use classify::WriteClassifier;
pub use events::EventSink;
pub use failover::{CallError, FailoverEvent, FailoverExecutor, Surfaced};
pub use gate::{GateHandle, Unbound};
pub use host::bare_host;
pub use pending::{AcquireBytes, BytesPermit, PendingBytes};
pub use pool::{ConnPool, Connector, Lease, PoolError};
pub use retry::{
    Always, Attempt, ByCause, Notify, Quiet, Retry, RetryError, RetryIf, SharedBudget, retry,
};
pub use runtime::{ManualClock, ManualSleep, Runtime};
pub use seed::{client_rng, next_client_id, process_seed};
pub use signal::{Changed, WakeSignal, wait_until};
pub use window::{
    Acquire, AcquireError, OwnedPermit, Permit, Released, STRIPES, TimedOut, TryAcquireError,
    WindowHandle,
};
pub use writer::{Append, SendBatch, WriteDriver, WriteError};

/// The handle was closed: the wait failed and nothing is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("closed")]
pub struct Closed;

/// User code that the operation depended on panicked (a transport or connect future, a key's
/// `Hash`, `Eq` or `Clone`, a classifier, a size callback): the operation failed, and
/// everything it held was given back. The handle keeps serving other and later callers.
///
/// The drivers' error: for user code run away from its caller (in a spawned task), and for
/// the user code of a driver's own input (`op_bytes` and the shard key in
/// [`BatchDriver::submit`], the key in [`ConnPool::lease`]). User code that a handle calls in
/// the caller's own call (a key passed to `WindowHandle::acquire`, the closure of
/// [`GateHandle::update`]) panics out to that caller instead, with nothing stranded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("user code panicked")]
pub struct Panicked;

/// Compile-time checks of the bounds `docs/design.md` §4 promises: handles `Clone + Send + Sync`,
/// permits and futures `Send`, for any `Send + Sync` key and hasher and any [`Runtime`].
#[allow(dead_code)]
fn assert_bounds<Shard, S, R>()
where
    Shard: core::hash::Hash + Eq + Clone + Send + Sync + 'static,
    S: core::hash::BuildHasher + Send + Sync + 'static,
    R: Runtime,
{
    fn handle<T: Clone + Send + Sync + 'static>() {}
    fn send<T: Send + 'static>() {}
    fn send_value<T: Send>(_: &T) {}
    handle::<WindowHandle<Shard, S>>();
    send::<OwnedPermit<Shard, S>>();
    send::<Acquire<'static, Shard, S>>();
    // The borrowed forms, through a closure that is type-checked and never called.
    let _borrowed = |window: &WindowHandle<Shard, S>, shard: Shard| {
        send_value(&window.acquire(shard.clone()));
        send_value(&window.try_acquire(shard));
        send_value(&window.closed());
    };
    let _bytes = |bytes: &PendingBytes| send_value(&bytes.closed());
    handle::<PendingBytes>();
    send::<BytesPermit>();
    send::<AcquireBytes>();
    handle::<GateHandle<Shard, S>>();
    handle::<WakeSignal>();
    send::<Changed>();
    handle::<ManualClock>();
    send::<ManualSleep>();
    // The unnameable futures of the async fns, for every runtime.
    let _gate = |gate: &GateHandle<Shard, S>, rt: &R, bucket: &Shard| {
        send_value(&gate.wait_until_open(rt, bucket));
        send_value(&gate.drive_timeouts(rt));
    };
    handle::<GateHandle<Shard, S, R>>();
    let _bound = |gate: &GateHandle<Shard, S, R>, bucket: &Shard| {
        send_value(&gate.wait_until_open(bucket));
        send_value(&gate.drive_timeouts());
    };
    let _wait = |rt: &R, signal: &WakeSignal| {
        send_value(&wait_until(rt, signal, |_| None));
    };
}

/// The drivers' bounds: handles `Clone + Send + Sync`, leases and futures `Send`, for `Send`
/// keys, operations, connections and closures.
#[allow(dead_code)]
fn assert_driver_bounds<R, T, C, Shard, Op, U, H, S, K, B>()
where
    R: Runtime,
    T: Transport<Shard, Op>,
    C: Connector<H>,
    Shard: core::hash::Hash + Eq + Clone + Send + Sync + 'static,
    Op: Send + 'static,
    U: core::hash::Hash + Eq + Clone + Send + Sync + 'static,
    H: core::hash::Hash + Eq + Clone + Send + Sync + 'static,
    S: core::hash::BuildHasher + Clone + Send + Sync + 'static,
    K: crate::failover::ErrorClassifier<u32> + Send + Sync + 'static,
    B: crate::RetryBudget + Send + 'static,
{
    fn handle<X: Clone + Send + Sync + 'static>() {}
    fn send<X: Send + 'static>() {}
    fn send_value<X: Send>(_: &X) {}
    handle::<BatchDriver<R, T, Shard, Op, S>>();
    send::<Submit<T::Output, T::Error>>();
    handle::<ConnPool<R, C, U, H, S>>();
    send::<Lease<R, C, U, H, S>>();
    handle::<FailoverExecutor<R, K, B>>();
    let _pool = |pool: &ConnPool<R, C, U, H, S>, key: &crate::ConnKey<U, H>| {
        send_value(&pool.lease(key));
        send_value(&pool.drive_timeouts());
        send_value(&pool.closed());
    };
    let _batch = |driver: &BatchDriver<R, T, Shard, Op, S>| send_value(&driver.closed());
    handle::<WriteDriver<R, Shard, U, u32, u8, S>>();
    send::<Append>();
    let _writer = |driver: &WriteDriver<R, Shard, U, u32, u8, S>| send_value(&driver.closed());
    let _call = |fx: &FailoverExecutor<R, K, B>| {
        send_value(&fx.call(|| async { Ok::<u8, u32>(1) }, || async { true }));
        send_value(&fx.call_until(None, |_| async { Ok::<u8, u32>(1) }, || async { true }));
        send_value(&fx.closed());
    };
}
