//! async-std 1.13 adapter for [`throttle_sansio`].
//!
//! async-std is deprecated upstream (RUSTSEC-2025-0052); this crate stays a thin mirror of
//! `throttle-tokio`, file for file, for clients that still run on it. It holds
//! [`AsyncStdRuntime`], the core's [`Runtime`](sync::Runtime) on the system's monotonic clock
//! (a [`StdEpoch`](time::StdEpoch)), async-std's timer and `spawn`; and [`TcpConnector`], a
//! [`Connector`](sync::Connector) over `async_std::net::TcpStream`. Everything else is the
//! core's, re-exported here: [`sync::GateHandle::wait_until_open`], [`sync::WindowHandle`] and
//! [`sync::Permit`], [`sync::PendingBytes`], [`sync::BatchDriver`], [`sync::ConnPool`],
//! [`sync::FailoverExecutor`].
//!
//! As in `throttle-tokio`, the crate root names each handle and driver with the runtime fixed
//! to [`AsyncStdRuntime`] and the hasher defaulting to std's `RandomState`: [`GateHandle<K>`]
//! (inputs without `now` or RNG), [`WindowHandle<Shard>`], [`BatchDriver<T, Shard, Op>`],
//! [`ConnPool<C, U, H>`], [`Lease<C, U, H>`], [`FailoverExecutor<K, B>`],
//! [`WriteDriver<B, N, R, Resp>`], the retry helper [`retry(rt, op)`](retry()), and re-exports
//! [`PendingBytes`] and [`WakeSignal`]. The generic forms stay in [`sync`].
//!
//! async-std has no paused time: tests inject a [`sync::ManualClock`] instead (a `Runtime`
//! whose `now`/`sleep_until` come from the manual clock and whose `spawn` is async-std's). A
//! few short conformance cases also run on this crate's real clock and timer.
//!
//! ```
//! use throttle_async_std::{AsyncStdRuntime, sync::Runtime};
//! use throttle_sansio::Instant;
//!
//! let rt = AsyncStdRuntime::new();
//! async_std::task::block_on(rt.sleep_until(Instant::ZERO)); // passed: at once
//! assert!(rt.now() >= Instant::ZERO);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod net;
mod runtime;

use std::hash::RandomState;

pub use net::TcpConnector;
pub use runtime::AsyncStdRuntime;
pub use throttle_sansio::sync::{PendingBytes, WakeSignal};
pub use throttle_sansio::*;

/// The write gate handle on async-std: [`sync::GateHandle`] bound to [`AsyncStdRuntime`]. Its
/// inputs read `now` from the runtime's clock and draw jitter from the handle's own
/// per-client generator ([`sync::client_rng`]), so they take neither; build it with
/// [`with_runtime`](sync::GateHandle::with_runtime).
///
/// ```
/// use core::time::Duration;
/// use throttle_async_std::{AsyncStdRuntime, GateHandle, GateState, Reason, WriteGateConfig};
///
/// let rt = AsyncStdRuntime::new();
/// let gate: GateHandle<u32> = GateHandle::with_runtime(rt, WriteGateConfig::default()).unwrap();
/// let start = rt.now();
/// gate.handle_throttle(&7, Reason::RETRIABLE_WRITE, Duration::from_millis(20)).unwrap();
/// let state = async_std::task::block_on(gate.wait_until_open(&7));
/// assert_eq!(state, GateState::Open);
/// assert!(rt.now() - start >= Duration::from_millis(20));
/// ```
pub type GateHandle<K, S = RandomState> = sync::GateHandle<K, S, AsyncStdRuntime>;

/// The dispatch window handle, with std's `RandomState` by default: [`sync::WindowHandle`]
/// (it needs no runtime: a credit is not a deadline).
///
/// ```
/// use throttle_async_std::{WindowConfig, WindowHandle};
///
/// let window: WindowHandle<u32> =
///     WindowHandle::new(WindowConfig::default().with_max_in_flight(1)).unwrap();
/// async_std::task::block_on(async {
///     let permit = window.acquire(7).await.unwrap();
///     assert_eq!(window.available(&7), 0);
///     drop(permit);
///     assert_eq!(window.available(&7), 1);
/// });
/// ```
pub type WindowHandle<Shard, S = RandomState> = sync::WindowHandle<Shard, S>;

/// The batch driver on async-std: [`sync::BatchDriver`] with [`AsyncStdRuntime`] and std's
/// `RandomState` by default.
///
/// ```
/// use throttle_async_std::{AsyncStdRuntime, sync};
///
/// fn same<T: sync::Transport<u32, u64>>(
///     d: throttle_async_std::BatchDriver<T, u32, u64>,
/// ) -> sync::BatchDriver<AsyncStdRuntime, T, u32, u64, std::hash::RandomState> {
///     d
/// }
/// ```
pub type BatchDriver<T, Shard, Op, S = RandomState> =
    sync::BatchDriver<AsyncStdRuntime, T, Shard, Op, S>;

/// The connection pool on async-std: [`sync::ConnPool`] with [`AsyncStdRuntime`] and std's
/// `RandomState` by default (e.g. `ConnPool<TcpConnector, u32, String>`).
///
/// ```
/// use throttle_async_std::{AsyncStdRuntime, TcpConnector, sync};
///
/// fn same(
///     p: throttle_async_std::ConnPool<TcpConnector, u32, String>,
/// ) -> sync::ConnPool<AsyncStdRuntime, TcpConnector, u32, String, std::hash::RandomState> {
///     p
/// }
/// ```
pub type ConnPool<C, U, H, S = RandomState> = sync::ConnPool<AsyncStdRuntime, C, U, H, S>;

/// A lease of a [`ConnPool`] on async-std: [`sync::Lease`] with [`AsyncStdRuntime`].
pub type Lease<C, U, H, S = RandomState> = sync::Lease<AsyncStdRuntime, C, U, H, S>;

/// The failover executor on async-std: [`sync::FailoverExecutor`] with [`AsyncStdRuntime`].
///
/// ```
/// use throttle_async_std::{AsyncStdRuntime, sync};
///
/// fn same<K, B>(
///     x: throttle_async_std::FailoverExecutor<K, B>,
/// ) -> sync::FailoverExecutor<AsyncStdRuntime, K, B> {
///     x
/// }
/// ```
pub type FailoverExecutor<K, B> = sync::FailoverExecutor<AsyncStdRuntime, K, B>;

/// The paced write driver on async-std: [`sync::WriteDriver`] with [`AsyncStdRuntime`] and
/// std's `RandomState` by default. Buckets `B`, leaders `N`, records `R`, one server answer
/// `Resp` per batch; build it with [`new`](sync::WriteDriver::new) (its sender task is
/// spawned on async-std).
///
/// ```
/// use core::time::Duration;
/// use throttle_async_std::backoff::{BackoffConfig, Jitter};
/// use throttle_async_std::paced_writer::{PacedWriterConfig, WriteOutcome};
/// use throttle_async_std::sync::SendBatch;
/// use throttle_async_std::{AsyncStdRuntime, Signal, WriteDriver, WriteGateConfig};
///
/// // A 10 ms backoff after a disk-write-locked rejection (the default is Fluss's, longer).
/// let disk = BackoffConfig::builder()
///     .initial(Duration::from_millis(10))
///     .jitter(Jitter::None)
///     .build()
///     .unwrap();
/// let cfg = PacedWriterConfig::default()
///     .with_gate(WriteGateConfig::default().with_disk_write_locked(disk));
/// // The server answers `true` (written) or `false` (disk write locked) per batch: the first
/// // send is rejected, the retry after the backoff is written.
/// let sends = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
/// let counted = sends.clone();
/// let driver: WriteDriver<u32, u16, &'static str, bool> = WriteDriver::new(
///     AsyncStdRuntime::new(),
///     cfg,
///     move |_node: u16, batches: Vec<SendBatch<u32, &'static str>>| {
///         let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///         async move { vec![n > 0; batches.len()] }
///     },
///     |written: &bool| match written {
///         true => WriteOutcome::Ok { pressure: Signal::Clear },
///         false => WriteOutcome::DiskWriteLocked,
///     },
/// )
/// .expect("a valid config");
/// driver.set_leader(7, Some(1));
/// async_std::task::block_on(async {
///     assert_eq!(driver.append(7, "hello", 5).await, Ok(()));
///     driver.close();
///     driver.closed().await; // nothing in flight any more
/// });
/// assert_eq!(sends.load(std::sync::atomic::Ordering::SeqCst), 2);
/// ```
pub type WriteDriver<B, N, R, Resp, S = RandomState> =
    sync::WriteDriver<AsyncStdRuntime, B, N, R, Resp, S>;

/// [`sync::retry`] on async-std: retries `op` with its sleeps on `rt`'s timer, configured and
/// run as the core's [`sync::Retry`] (this only fixes the runtime type; the retry is the
/// core's).
///
/// The runtime is passed, not made here: a [`deadline`](sync::Retry::deadline) is an
/// [`Instant`] on that runtime's timeline (`rt.now() + timeout`), and every `AsyncStdRuntime`
/// value has its own epoch.
///
/// ```
/// use core::time::Duration;
/// use throttle_async_std::AsyncStdRuntime;
/// use throttle_async_std::backoff::{BackoffConfig, Jitter};
/// use throttle_async_std::sync::Runtime;
///
/// let rt = AsyncStdRuntime::new();
/// let backoff = BackoffConfig::builder()
///     .initial(Duration::from_millis(5))
///     .jitter(Jitter::None)
///     .build()
///     .unwrap();
/// let start = rt.now();
/// // Busy twice, then the answer: sleeps of 5 ms and 10 ms on the system clock.
/// let got = async_std::task::block_on(
///     throttle_async_std::retry(rt, |a| async move {
///         if a.number < 3 { Err("busy") } else { Ok(a.number) }
///     })
///     .backoff(backoff)
///     .deadline(rt.now() + Duration::from_secs(5))
///     .into_future(),
/// );
/// assert_eq!(got, Ok(3));
/// assert!(rt.now() - start >= Duration::from_millis(15));
/// ```
pub fn retry<'a, Op, Fut>(
    rt: AsyncStdRuntime,
    op: Op,
) -> sync::Retry<'a, AsyncStdRuntime, Op, sync::Always, sync::Quiet, failover::Unlimited>
where
    Op: FnMut(sync::Attempt) -> Fut,
    Fut: core::future::Future,
{
    sync::retry(rt, op)
}
