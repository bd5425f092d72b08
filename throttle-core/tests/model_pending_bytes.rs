#![cfg(feature = "model")]
//! Property test of the pending-bytes limiter against its naive FIFO reference.

mod common;

use proptest::prelude::*;
use throttle_sansio::model::pending_bytes::check;

proptest! {
    #![proptest_config(common::config())]

    #[test]
    fn limiter_conserves_bytes_stays_under_limit_and_admits_in_ticket_order(
        data in common::bytes(15)
    ) {
        if let Err(divergence) = check(&data) {
            prop_assert!(false, "{}", divergence);
        }
    }
}

/// Inputs far longer than the proptest ones, so deep queues and long runs of stale
/// announcements are reached deterministically.
#[test]
#[cfg_attr(miri, ignore)]
fn long_deterministic_inputs_match_the_reference() {
    use throttle_sansio::rng::{Rng, SplitMix64};
    let mut rng = SplitMix64::new(0x5eed);
    for round in 0..4 {
        let data: Vec<u8> = (0..16 * 1024)
            .map(|_| common::biased_byte(rng.next_u64(), 15))
            .collect();
        if let Err(divergence) = check(&data) {
            panic!("round {round}: {divergence}");
        }
    }
}
