#![doc = include_str!("../README.md")]
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Every keyed machine and the model checkers allocate; `alloc` is part of the contract even
// while a given feature set uses none of it.
#[allow(unused_extern_crates)]
extern crate alloc;
// Unit tests use `std` for `catch_unwind` (panic-safety tests) even without the feature.
#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod backoff;
pub mod backpressure;
pub mod batcher;
pub mod conn_key;
pub mod dispatch_window;
mod divisor;
pub mod error;
pub mod event;
pub mod failover;
pub mod grpc_config;
pub mod limiter;
mod maintenance;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod mirror;
pub mod options;
pub mod paced_writer;
pub mod pending_bytes;
pub mod rng;
mod slab;
pub mod snapshot;
#[cfg(feature = "std")]
#[cfg_attr(docsrs, doc(cfg(feature = "std")))]
pub mod sync;
pub mod time;
pub mod write_gate;

#[cfg(any(test, feature = "model"))]
mod test_hasher;
#[cfg(test)]
mod test_key;

#[cfg(feature = "model")]
pub mod model;

pub use backoff::{Backoff, BackoffConfig, Jitter, JitterOrder};
pub use backpressure::{Decision, PressureConfig, ServerPressure, Signal, ThrottleCurve};
pub use batcher::{
    Batch, BatchAction, BatchEvent, BatchKind, Batcher, BatcherConfig, FailReason, OpId, Oversized,
    RefuseReason, Refused, RequeueError, Withdrawal,
};
pub use conn_key::{
    BackoffFrom, CloseCause, ConnAction, ConnConfig, ConnEvent, ConnId, ConnKey, ConnTable,
    ConnectAttempt, EndpointSnapshot, Route,
};
pub use dispatch_window::{
    CreditId, Dispatch, DispatchWindow, ShardSnapshot, SingleWindow, SubmitError, Submitted,
    WindowConfig, WindowEvent,
};
pub use error::{ConfigError, Exhausted, ReleaseError};
pub use failover::{
    Call, CallAction, CallConfig, CallEvent, ErrorClass, RefreshCoalescer, RefreshEvent,
    RetryBudget,
};
pub use limiter::{Limiter, LimiterConfig};
pub use paced_writer::{PacedWriter, PacedWriterConfig, WriteOutcome, WriterAction};
pub use pending_bytes::{Grant, PendingBytesConfig, PendingBytesLimiter, Ticket};
pub use rng::Rng;
pub use time::Instant;
pub use write_gate::{GateAction, GateEvent, GateState, Reason, WriteGate, WriteGateConfig};

/// The proptest settings of the crate's unit tests: `cases` normally, a handful under miri,
/// and no failure files (the crate's tests must not write into the source tree).
#[cfg(test)]
pub(crate) fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        // miri runs every case ~100x slower; a few cases keep its UB check meaningful.
        cases: if cfg!(miri) { 3 } else { cases },
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}
