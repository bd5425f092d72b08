#![cfg(feature = "model")]
//! proptest driver for the dispatch-window model checker.

mod common;

use proptest::prelude::*;
use throttle_sansio::model::dispatch_window::{check, check_single};

proptest! {
    #![proptest_config(common::config())]

    /// Credits are conserved (floored at 0 after a shrink), issued only below each shard's
    /// capacity (configured or set at run time), released exactly once,
    /// dispatched FIFO per shard, every batch leaves once and idle shards hold no state.
    #[test]
    fn window_matches_reference_and_conserves_credits(
        data in common::bytes(28)
    ) {
        prop_assert_eq!(check(&data), Ok(()));
    }

    /// The single-shard window answers every operation as the reference (and so the
    /// multi-shard window, on one shard) does.
    #[test]
    fn single_window_matches_reference(
        data in common::bytes(28)
    ) {
        prop_assert_eq!(check_single(&data), Ok(()));
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
    assert_eq!(check_single(&data), Ok(()));
}

#[test]
fn crafted_drain_sends_what_is_held_back() {
    // After the limit byte, each op is: op byte, shard byte, op-specific bytes.
    let data = [
        4, //          max_in_flight = 1
        0, 0, 0, //    submit -> dispatched
        0, 0, 0, //    submit -> queued
        16, 0, //      enqueue -> queued (ticket)
        4, 0, 1, //    submit_or_park -> parked
        23, 0, 0, //   drain (below(4) == 0): refuses new batches, keeps the held ones
        0, 0,
        0, //    submit -> refused Closed
           // The run ends draining: every credit is completed until the queued batches and
           // the parked one have left, in order, and the window is drained.
    ];
    assert_eq!(check(&data), Ok(()));
    assert_eq!(check_single(&data), Ok(()));
}
