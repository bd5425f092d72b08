//! The loopback demo's reusable parts, shared by `examples/loopback/main.rs` and
//! `tests/e2e_loopback.rs` (which includes this module with `#[path]`).
#![allow(dead_code)]

pub mod clients;
pub mod conn;
pub mod proto;
pub mod report;
pub mod scenario;
pub mod server;
