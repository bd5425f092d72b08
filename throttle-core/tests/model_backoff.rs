#![cfg(feature = "model")]

mod common;

use proptest::prelude::*;
use throttle_sansio::model::backoff::check;

proptest! {
    #![proptest_config(common::config())]

    /// Every delay stays within its strategy's bounds, in [floor, max], on the resolution grid
    /// and within the budget; the additive offset is constant within a sequence; invalid
    /// configs are refused and valid ones accepted.
    #[test]
    fn backoff_delays_stay_within_strategy_bounds_floor_max_and_grid(
        data in common::bytes(11)
    ) {
        prop_assert_eq!(check(&data), Ok(()));
    }

    /// On a 1 ns grid with small fractional multipliers, where truncation hides no slip and
    /// growth from a jittered start differs from a scaled base, every delay and every RNG draw
    /// still match the reference exactly, and slow ramps are refused by both.
    #[test]
    fn backoff_matches_the_reference_exactly_on_a_1ns_grid_with_fractional_growth(
        initial in any::<u16>(),
        extra in any::<u32>(),
        (a, b) in (any::<u8>(), any::<u8>()),
        jitter in 0u8..7,
        range in any::<u16>(),
        rest in common::bytes(11)
    ) {
        prop_assert_eq!(check(&fine_grid(initial, extra, (a, b), jitter, range, &rest)), Ok(()));
    }
}

/// Input bytes for `check`: the general preset with initial (span kind 5, u16 ns), max
/// (kind 3, u64 ns: `initial + extra`), multiplier (kind 2, two u8), jitter and a 1 ns
/// resolution overridden (mask 31), then `rest` (seed and calls).
fn fine_grid(
    initial: u16,
    extra: u32,
    (a, b): (u8, u8),
    jitter: u8,
    range: u16,
    rest: &[u8],
) -> Vec<u8> {
    let max = u64::from(initial) + u64::from(extra);
    let mut v = vec![0, 31, 31, 5];
    v.extend_from_slice(&initial.to_le_bytes());
    v.push(3);
    v.extend_from_slice(&max.to_le_bytes());
    let (num, den) = (a.max(b).max(1), a.min(b).max(1));
    v.extend_from_slice(&[2, num, den, jitter]);
    match jitter {
        1 => v.push(0), // ±20 %
        2 => {
            v.push(5); // a u16 ns range
            v.extend_from_slice(&range.to_le_bytes());
        }
        6 => v.push(0), // per-delay, backon's [d, 2d)
        _ => {}
    }
    v.push(0); // 1 ns resolution
    v.extend_from_slice(rest);
    v
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
    // Issue 15: each preset, then operation 10 flipping the jitter order and the first-delay
    // rule (and the ignored byte once MIN_CONNECT_TIMEOUT), then more calls; gRPC's own preset (4)
    // flipped back to jitter-then-cap.
    for preset in 0..6 {
        for (order, first) in [(1u8, 1u8), (0, 0), (1, 0), (0, 1)] {
            let mut v = vec![preset, 0, 0];
            v.extend([0x42; 8]);
            v.extend([0, 0, 0, 10, order, first, 1]);
            v.extend(core::iter::repeat_n([0u8, 0, 8, 6, 0, 7, 0], 20).flatten());
            assert_eq!(
                check(&v),
                Ok(()),
                "preset {preset} order {order} first {first}"
            );
        }
    }
}
