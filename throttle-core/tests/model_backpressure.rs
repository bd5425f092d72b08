#![cfg(feature = "model")]
//! proptest driver for the backpressure model check (`throttle_sansio::model::backpressure`).

mod common;

use proptest::prelude::*;
use throttle_sansio::model::backpressure::check;

proptest! {
    #![proptest_config(common::config())]

    #[test]
    fn server_decisions_signals_and_curve_match_the_naive_reference(
        data in common::bytes(7)
    ) {
        if let Err(divergence) = check(&data) {
            panic!("{divergence}");
        }
    }
}

/// Fixed inputs that reach the flush budget, the latch and the wire edges on every run.
#[test]
fn scripted_sequences_match_the_naive_reference() {
    // Tf 8, Tr 20, 64 MiB / 2 budget, k 2 at 3000 ms, then: L0 17, pending 1 byte, latch,
    // flush, the f32 just below 1, L0 at Tr.
    let script: &[u8] = &[
        5, 8, 5, 20, 1, 3, 5, 2, 2, 6, 0xb8, 0x0b, // Tf, Tr, budget, k, max
        0, 5, 17, // L0 17
        2, 4, 0, // pending 1 byte
        3, 4, // latch, flush
        5, 0, 12, // the f32 just below 1
        0, 4, // L0 at Tr
    ];
    assert_eq!(check(script), Ok(()));
    let seeds = if cfg!(miri) { 0u8..=3 } else { 0u8..=255 };
    for seed in seeds {
        let bytes: Vec<u8> = (0u8..200)
            .map(|i| i.wrapping_mul(seed).wrapping_add(seed))
            .collect();
        assert_eq!(check(&bytes), Ok(()), "seed {seed}");
    }
}
