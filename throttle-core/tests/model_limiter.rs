#![cfg(feature = "model")]
//! Property test of the adaptive limiter against its naive reference (`docs/limiter.md`).

mod common;

use proptest::prelude::*;
use throttle_sansio::model::limiter::check;

proptest! {
    #![proptest_config(common::config())]

    // u128 division is an interpreted routine under miri (minutes per case); the limiter has
    // no `unsafe`, so this runs in the ordinary test pass only.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn limiter_follows_the_integer_rules_and_stays_within_its_bounds(
        data in common::bytes(3)
    ) {
        if let Err(divergence) = check(&data) {
            prop_assert!(false, "{}", divergence);
        }
    }
}

/// Inputs far longer than the proptest ones, so Gradient2's long-term average leaves its
/// warm-up and windows close many times.
#[test]
#[cfg_attr(miri, ignore)]
fn long_deterministic_inputs_match_the_reference() {
    use throttle_sansio::rng::{Rng, SplitMix64};
    let mut rng = SplitMix64::new(0x11317);
    for round in 0..8 {
        let data: Vec<u8> = (0..16 * 1024)
            .map(|_| common::biased_byte(rng.next_u64(), 3))
            .collect();
        if let Err(divergence) = check(&data) {
            panic!("round {round}: {divergence}");
        }
    }
}
