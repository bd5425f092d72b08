#![cfg(feature = "model")]
//! proptest driver for the failover checkers (calls + coalescer, coalescer alone, budgets).

mod common;

use proptest::prelude::*;
use throttle_sansio::model::failover::{check, check_budget, check_call, check_coalescer};

proptest! {
    #![proptest_config(common::config())]

    #[test]
    fn calls_complete_once_never_retry_never_and_share_one_refresh(
        data in common::bytes(12)
    ) {
        if let Err(d) = check_call(&data) {
            prop_assert!(false, "{}", d);
        }
    }

    #[test]
    fn coalescer_starts_one_refresh_per_generation_and_releases_each_waiter_once(
        data in common::bytes(4)
    ) {
        if let Err(d) = check_coalescer(&data) {
            prop_assert!(false, "{}", d);
        }
    }

    #[test]
    fn budgets_match_a_naive_recount(
        data in common::bytes(7)
    ) {
        if let Err(d) = check_budget(&data) {
            prop_assert!(false, "{}", d);
        }
    }
}

#[test]
#[cfg_attr(miri, ignore)] // five 300..4096-byte runs: minutes under miri
fn deterministic_byte_patterns_pass_every_checker() {
    // Fixed inputs that reach the interesting corners quickly: repeated needs (coalescer
    // full), a stream of errors with refreshes, and long runs of one op.
    let mut seeded = Vec::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        seeded.push(x as u8);
    }
    for data in [
        &[][..],
        &[1; 300][..],
        &[2; 300][..],
        &[0xFF; 300][..],
        &seeded[..],
    ] {
        assert_eq!(check(data), Ok(()));
    }
}
