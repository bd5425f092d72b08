#![cfg(feature = "model")]
//! proptest driver for the dispatch-window model checker.

mod common;

use proptest::prelude::*;
use throttle_sansio::model::dispatch_window::check;

proptest! {
    #![proptest_config(common::config())]

    /// Credits are conserved, at most `max_in_flight` per shard, released exactly once,
    /// dispatched FIFO per shard, every batch leaves once and idle shards hold no state.
    #[test]
    fn window_matches_reference_and_conserves_credits(
        data in common::bytes(23)
    ) {
        prop_assert_eq!(check(&data), Ok(()));
    }
}

#[test]
fn crafted_sequences_match_reference() {
    // Each op is: shard byte, op byte, op-specific bytes.
    let data = [
        1, //           max_in_flight = 2
        0, 0, 0, //     shard 0: submit -> dispatched
        0, 0, 0, //     submit -> dispatched (window now exhausted)
        0, 0, 0, //     submit -> queued
        0, 4, 1, //     submit_or_park -> parked
        0, 7, 0, //     complete the first live credit -> dispatches the queued batch
        0, 11, 0, 0, // complete the first credit ever issued again -> AlreadyReleased
        0, 12, 0, 0, // forged credit (slot u32::MAX, generation 0) -> Unknown
        0, 13, 0, //    close -> returns the parked batch
    ];
    assert_eq!(check(&data), Ok(()));
}
