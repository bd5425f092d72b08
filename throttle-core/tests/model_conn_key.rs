#![cfg(feature = "model")]
//! proptest driver for the connection-table model check (`throttle_sansio::model::conn_key`).

mod common;

use proptest::prelude::*;
use throttle_sansio::model::conn_key::check;

proptest! {
    #![proptest_config(common::config())]

    /// Routes, connects, sends, closes (stale ids included), disconnects and timeouts under
    /// changing addresses per uid: the table agrees with the naive reference, never holds two
    /// live connections for one endpoint, and closes every connection it opened exactly once.
    #[test]
    fn table_matches_reference_and_closes_every_connection_once(
        data in common::bytes(38)
    ) {
        if let Err(d) = check(&data) {
            prop_assert!(false, "{}", d);
        }
    }
}

/// Long byte strings from a fixed generator reach deeper states than proptest's shrinkable
/// inputs (many endpoints in backoff, long-lived retired addresses).
#[test]
#[cfg_attr(miri, ignore)]
fn long_deterministic_runs_match_reference() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for run in 0..16 {
        let data: Vec<u8> = (0..8_192)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                common::biased_byte(x, 38)
            })
            .collect();
        assert_eq!(check(&data), Ok(()), "run {run}");
    }
}
