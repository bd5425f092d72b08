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
//! [`ConnPool<C, U, H>`], [`Lease<C, U, H>`], [`FailoverExecutor<K, B>`], and re-exports
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
