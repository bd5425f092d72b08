#![doc = include_str!("../../README.md")]
//!
//! (This package holds the workspace's scenario tests, the simulator and the benchmarks; it is
//! not published. Including the README here makes its example a doctest.)
#![forbid(unsafe_code)]

pub mod sim;
