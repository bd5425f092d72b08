//! Tokio adapter for [`throttle_sansio`].
//!
//! It holds only what is specific to tokio ([`docs/design.md` §5][design]): [`TokioRuntime`], the
//! core's [`Runtime`](sync::Runtime) on tokio's clock (so `tokio::time::pause` drives the
//! machines), timer and `spawn`; and [`TcpConnector`], a [`Connector`](sync::Connector) over
//! `tokio::net::TcpStream`. Everything else — the handles, permits and drivers of [`sync`] — is the
//! core's, re-exported here:
//!
//! - [`sync::GateHandle::wait_until_open`] (wakes early on the gate's `Wake`),
//! - [`sync::WindowHandle::acquire`] → [`sync::Permit`], [`sync::PendingBytes::acquire`],
//! - [`sync::BatchDriver`], [`sync::ConnPool`], [`sync::FailoverExecutor`].
//!
//! ```
//! use throttle_tokio::{TokioRuntime, sync::Runtime};
//! use throttle_sansio::Instant;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let rt = TokioRuntime::new();
//! rt.sleep_until(Instant::from_millis(250)).await; // paused time: returns at once
//! assert_eq!(rt.now(), Instant::from_millis(250));
//! # }
//! ```
//!
//! [design]: https://github.com/throttle-rs/throttle/blob/main/docs/design.md
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod net;
mod runtime;

pub use net::TcpConnector;
pub use runtime::TokioRuntime;
pub use throttle_sansio::*;
