#![cfg(feature = "model")]

mod common;

use proptest::prelude::*;
use throttle_core::model::backoff::check;

proptest! {
    #![proptest_config(common::config())]

    /// Every delay stays within its strategy's bounds, in [floor, max], on the resolution grid
    /// and within the budget; the additive offset is constant within a sequence; invalid
    /// configs are refused and valid ones accepted.
    #[test]
    fn backoff_delays_stay_within_strategy_bounds_floor_max_and_grid(
        data in proptest::collection::vec(any::<u8>(), 0..common::MAX_LEN)
    ) {
        prop_assert_eq!(check(&data), Ok(()));
    }
}

/// Hand-picked inputs: each preset with many delays, a slow ramp, extreme values and a budget.
#[test]
fn backoff_model_accepts_hand_picked_scenarios() {
    let long_run = |preset: u8, mask: u8| {
        let mut v = vec![preset, mask, mask];
        v.extend(core::iter::repeat_n(0u8, 200));
        v
    };
    for preset in 0..6 {
        assert_eq!(check(&long_run(preset, 0)), Ok(()));
    }
    // General preset, budget override (mask bit 64): Some(span 4 = 1_000 ms), then calls.
    let mut budget = vec![0, 64, 64, 0, 4, 0xE8, 0x03];
    budget.extend(core::iter::repeat_n(0u8, 60));
    assert_eq!(check(&budget), Ok(()));
    // Initial and max both u64::MAX ns (span kind 2), then calls including delay_for(u32::MAX).
    let mut huge = vec![0, 3, 3, 2, 2];
    huge.extend([0u8; 8]);
    huge.extend([6, 1, 7, 0, 1, 8, 0, 5, 0]);
    assert_eq!(check(&huge), Ok(()));
}
