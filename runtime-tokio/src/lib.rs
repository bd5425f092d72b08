//! Tokio adapter for [`throttle_sansio`].
//!
//! It holds only what is specific to tokio ([`docs/design.md` §5][design]): [`TokioRuntime`], the
//! core's [`Runtime`](sync::Runtime) on tokio's clock (so `tokio::time::pause` drives the
//! machines), timer and `spawn` ([`TokioRuntime::try_current`] builds one, or says
//! [`NoRuntime`] outside a tokio runtime); and [`TcpConnector`], a [`Connector`](sync::Connector) over
//! `tokio::net::TcpStream`. Everything else — the handles, permits and drivers of [`sync`] — is the
//! core's, re-exported here, and named at the crate root with the runtime fixed to
//! [`TokioRuntime`] and the hasher defaulting to std's `RandomState`:
//!
//! | alias | is |
//! |---|---|
//! | [`GateHandle<K>`] | [`sync::GateHandle<K, RandomState, TokioRuntime>`]: inputs without `now` or RNG, `wait_until_open(&bucket)` |
//! | [`WindowHandle<Shard>`] | [`sync::WindowHandle<Shard, RandomState>`]: `acquire(shard)` → [`sync::Permit`] |
//! | [`BatchDriver<T, Shard, Op>`] | [`sync::BatchDriver<TokioRuntime, T, Shard, Op, RandomState>`] |
//! | [`ConnPool<C, U, H>`], [`Lease<C, U, H>`] | [`sync::ConnPool<TokioRuntime, C, U, H, RandomState>`], its lease |
//! | [`FailoverExecutor<K, B>`] | [`sync::FailoverExecutor<TokioRuntime, K, B>`] |
//! | [`WriteDriver<B, N, R, Resp>`] | [`sync::WriteDriver<TokioRuntime, B, N, R, Resp, RandomState>`]: the paced writer's loop, owned |
//! | [`retry(rt, op)`](retry()) | [`sync::retry`] with the runtime fixed to [`TokioRuntime`] |
//! | [`PendingBytes`], [`WakeSignal`] | the core's (they take no runtime) |
//!
//! The generic forms stay in [`sync`] (`throttle_tokio::sync::GateHandle<K, S, R>`), with the
//! unbound gate whose inputs take `now` for custom loops.
//!
//! ```
//! use throttle_tokio::{GateHandle, GateState, Instant, Signal, TokioRuntime, WriteGateConfig};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let rt = TokioRuntime::new();
//! let gate: GateHandle<u32> = GateHandle::with_runtime(rt.clone(), WriteGateConfig::default())
//!     .expect("the default config is valid");
//! let wait = gate.handle_kv_signal(&7, Signal::Pressure(500_000)); // no `now`, no RNG
//! assert_eq!(gate.wait_until_open(&7).await, GateState::Open); // paused time: at once
//! assert!(rt.now() >= Instant::ZERO + wait); // it slept until the opening
//! # }
//! ```
//!
//! [design]: https://github.com/throttle-rs/throttle/blob/main/docs/design.md
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod gate_sleep;
mod net;
mod runtime;

use std::hash::RandomState;

pub use gate_sleep::GateSleep;
pub use net::TcpConnector;
pub use runtime::{NoRuntime, TokioRuntime};
pub use throttle_sansio::sync::{PendingBytes, WakeSignal};
pub use throttle_sansio::*;

/// The write gate handle on tokio: [`sync::GateHandle`] bound to [`TokioRuntime`]. Its inputs
/// read `now` from tokio's clock and draw jitter from the handle's own per-client generator
/// ([`sync::client_rng`]), so they take neither; build it with
/// [`with_runtime`](sync::GateHandle::with_runtime).
///
/// ```
/// use throttle_tokio::{GateHandle, GateState, TokioRuntime, WriteGateConfig};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let gate: GateHandle<u32> =
///     GateHandle::with_runtime(TokioRuntime::new(), WriteGateConfig::default()).unwrap();
/// tokio::spawn({
///     let gate = gate.clone();
///     async move { gate.drive_timeouts().await } // evicts expired gates
/// });
/// gate.handle_disk_write_locked(&3, 0); // jittered backoff from the handle's generator
/// assert!(matches!(gate.check(&3), GateState::Closed { .. }));
/// assert_eq!(gate.wait_until_open(&3).await, GateState::Open); // paused time jumps ahead
/// # }
/// ```
pub type GateHandle<K, S = RandomState> = sync::GateHandle<K, S, TokioRuntime>;

/// The dispatch window handle, with std's `RandomState` by default: [`sync::WindowHandle`]
/// (it needs no runtime: a credit is not a deadline).
///
/// ```
/// use throttle_tokio::{WindowConfig, WindowHandle};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let window: WindowHandle<u32> =
///     WindowHandle::new(WindowConfig::default().with_max_in_flight(1)).unwrap();
/// let first = window.acquire_owned(7).await.unwrap();
/// let waiter = tokio::spawn({
///     let window = window.clone();
///     async move { window.acquire_owned(7).await.map(|p| p.credit()) }
/// });
/// tokio::task::yield_now().await; // the waiter joins the shard's line
/// assert_eq!(window.waiting(&7), 1);
/// drop(first); // the credit goes to the waiter
/// assert!(waiter.await.unwrap().is_ok());
/// # }
/// ```
pub type WindowHandle<Shard, S = RandomState> = sync::WindowHandle<Shard, S>;

/// The batch driver on tokio: [`sync::BatchDriver`] with [`TokioRuntime`] and std's
/// `RandomState` by default.
///
/// ```
/// use throttle_tokio::{TokioRuntime, sync};
///
/// // The same type, two names.
/// fn same<T: sync::Transport<u32, u64>>(
///     d: throttle_tokio::BatchDriver<T, u32, u64>,
/// ) -> sync::BatchDriver<TokioRuntime, T, u32, u64, std::hash::RandomState> {
///     d
/// }
/// ```
pub type BatchDriver<T, Shard, Op, S = RandomState> =
    sync::BatchDriver<TokioRuntime, T, Shard, Op, S>;

/// The connection pool on tokio: [`sync::ConnPool`] with [`TokioRuntime`] and std's
/// `RandomState` by default (e.g. `ConnPool<TcpConnector, u32, String>`).
///
/// ```
/// use throttle_tokio::{TcpConnector, TokioRuntime, sync};
///
/// fn same(
///     p: throttle_tokio::ConnPool<TcpConnector, u32, String>,
/// ) -> sync::ConnPool<TokioRuntime, TcpConnector, u32, String, std::hash::RandomState> {
///     p
/// }
/// ```
pub type ConnPool<C, U, H, S = RandomState> = sync::ConnPool<TokioRuntime, C, U, H, S>;

/// A lease of a [`ConnPool`] on tokio: [`sync::Lease`] with [`TokioRuntime`].
pub type Lease<C, U, H, S = RandomState> = sync::Lease<TokioRuntime, C, U, H, S>;

/// The failover executor on tokio: [`sync::FailoverExecutor`] with [`TokioRuntime`].
///
/// ```
/// use throttle_tokio::{TokioRuntime, sync};
///
/// fn same<K, B>(
///     x: throttle_tokio::FailoverExecutor<K, B>,
/// ) -> sync::FailoverExecutor<TokioRuntime, K, B> {
///     x
/// }
/// ```
pub type FailoverExecutor<K, B> = sync::FailoverExecutor<TokioRuntime, K, B>;

/// The paced write driver on tokio: [`sync::WriteDriver`] with [`TokioRuntime`] and std's
/// `RandomState` by default. Buckets `B`, leaders `N`, records `R`, one server answer `Resp`
/// per batch; build it with [`new`](sync::WriteDriver::new) (its sender task is spawned on the
/// runtime, so call it inside one).
///
/// ```
/// use throttle_tokio::paced_writer::{PacedWriterConfig, WriteOutcome};
/// use throttle_tokio::sync::SendBatch;
/// use throttle_tokio::{Signal, TokioRuntime, WriteDriver};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // The server answers `true` (written) or `false` (disk write locked) per batch: the first
/// // send is rejected, the retry after the gate's backoff is written.
/// let sends = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
/// let counted = sends.clone();
/// let driver: WriteDriver<u32, u16, &'static str, bool> = WriteDriver::new(
///     TokioRuntime::new(),
///     PacedWriterConfig::default(),
///     move |_node: u16, batches: Vec<SendBatch<u32, &'static str>>| {
///         let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///         async move { vec![n > 0; batches.len()] }
///     },
///     |written: &bool| match written {
///         true => WriteOutcome::Ok { pressure: Signal::Clear },
///         false => WriteOutcome::DiskWriteLocked,
///     },
/// )
/// .expect("the default config is valid");
/// driver.set_leader(7, Some(1));
/// assert_eq!(driver.append(7, "hello", 5).await, Ok(())); // paused time skips the backoff
/// assert_eq!(sends.load(std::sync::atomic::Ordering::SeqCst), 2);
/// driver.close();
/// driver.closed().await; // nothing in flight any more
/// # }
/// ```
pub type WriteDriver<B, N, R, Resp, S = RandomState> =
    sync::WriteDriver<TokioRuntime, B, N, R, Resp, S>;

/// [`sync::retry`] on tokio: retries `op` with its sleeps on `rt`'s timer, configured and run
/// as the core's [`sync::Retry`] (this only fixes the runtime type; the retry is the core's).
///
/// The runtime is passed, not made here: a [`deadline`](sync::Retry::deadline) is an
/// [`Instant`] on that runtime's timeline (`rt.now() + timeout`), and every `TokioRuntime`
/// value has its own epoch.
///
/// ```
/// use core::time::Duration;
/// use throttle_tokio::backoff::{BackoffConfig, Jitter};
/// use throttle_tokio::sync::{Runtime, RetryError};
/// use throttle_tokio::{Instant, TokioRuntime};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let rt = TokioRuntime::new();
/// let backoff = BackoffConfig::builder()
///     .initial(Duration::from_millis(100))
///     .jitter(Jitter::None)
///     .build()
///     .unwrap();
/// // Busy twice, then the answer: two sleeps of 100 ms and 200 ms on tokio's (paused) clock.
/// let got = throttle_tokio::retry(rt.clone(), |a| async move {
///     if a.number < 3 { Err("busy") } else { Ok(a.number) }
/// })
/// .backoff(backoff.clone())
/// .deadline(rt.now() + Duration::from_secs(1))
/// .await;
/// assert_eq!(got, Ok(3));
/// assert_eq!(rt.now(), Instant::from_millis(300));
///
/// // A retry that would start at or after the deadline is not made: the last error comes back.
/// let late: Result<(), _> = throttle_tokio::retry(rt.clone(), |_| async { Err("busy") })
///     .backoff(backoff)
///     .deadline(rt.now() + Duration::from_millis(150))
///     .await;
/// assert!(matches!(late, Err(RetryError::Surfaced(s)) if s.error == "busy"));
/// # }
/// ```
pub fn retry<'a, Op, Fut>(
    rt: TokioRuntime,
    op: Op,
) -> sync::Retry<'a, TokioRuntime, Op, sync::Always, sync::Quiet, failover::Unlimited>
where
    Op: FnMut(sync::Attempt) -> Fut,
    Fut: core::future::Future,
{
    sync::retry(rt, op)
}

/// The README's snippet, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_tokio_gate_reads_tokios_clock_for_its_inputs_and_its_wait() {
        let rt = TokioRuntime::new();
        let gate: GateHandle<u32> =
            GateHandle::with_runtime(rt.clone(), WriteGateConfig::default()).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let wait = gate.handle_kv_signal(&7, Signal::Full);
        let until = Instant::from_millis(1_000) + wait;
        assert!(
            matches!(gate.check(&7), GateState::Closed { until: u, .. } if u == until),
            "installed at tokio's 1 s"
        );
        assert_eq!(gate.wait_until_open(&7).await, GateState::Open);
        assert!(
            rt.now() >= until,
            "slept on tokio's timer until the opening"
        );
    }
}
