//! async-std 1.13 adapter for [`throttle_sansio`].
//!
//! async-std is deprecated upstream (RUSTSEC-2025-0052); this crate stays a thin mirror of
//! `throttle-tokio`, file for file, for clients that still run on it. It holds
//! [`AsyncStdRuntime`], the core's [`Runtime`](sync::Runtime) on the system's monotonic clock
//! (a `std::time::Instant` epoch), async-std's timer and `spawn`; and [`TcpConnector`], a
//! [`Connector`](sync::Connector) over `async_std::net::TcpStream`. Everything else is the
//! core's, re-exported here: [`sync::GateHandle::wait_until_open`], [`sync::WindowHandle`] and
//! [`sync::Permit`], [`sync::PendingBytes`], [`sync::BatchDriver`], [`sync::ConnPool`],
//! [`sync::FailoverExecutor`].
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

pub use net::TcpConnector;
pub use runtime::AsyncStdRuntime;
pub use throttle_sansio::*;
