#![cfg(feature = "model")]
//! proptest driver for the write gate's model checker (see `src/model/write_gate.rs`).

mod common;

use proptest::prelude::*;
use throttle_sansio::model::write_gate::check;

proptest! {
    #![proptest_config(common::config())]

    /// Whatever the operations, the gate agrees with the naive reference after every one:
    /// remaining = max over reasons, check/explain/poll_timeout/len, wake exactly on a
    /// decrease, and no gate survives its deadline after handle_timeout.
    #[test]
    fn gate_matches_naive_reference_after_every_operation(
        data in common::bytes(19)
    ) {
        let verdict = check(&data);
        prop_assert!(verdict.is_ok(), "{}", verdict.unwrap_err());
    }
}

/// Dense bursts of the interesting operations (installs, KV, leaders, probes, timeouts), so
/// the deterministic run reaches probe exhaustion and leader churn without luck.
#[test]
fn gate_matches_reference_on_dense_seeded_streams() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for case in 0..if cfg!(miri) { 2 } else { 300 } {
        let mut bytes = vec![case as u8];
        for _ in 0..(if cfg!(miri) { 40 } else { 600 }) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            bytes.push(state as u8);
        }
        if let Err(e) = check(&bytes) {
            panic!("case {case}: {e}");
        }
    }
}
