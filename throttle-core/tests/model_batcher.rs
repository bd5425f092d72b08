#![cfg(feature = "model")]
//! proptest driver for the batcher model checker.

mod common;

use proptest::prelude::*;
use throttle_sansio::model::batcher::check;

proptest! {
    #![proptest_config(common::config())]

    /// Every operation ends exactly once or is withdrawn once (only before its batch left),
    /// batches leave FIFO per shard with the reference's cuts, at most `max_in_flight` per
    /// shard, an emptied batch never leaves, and idle shards hold no state.
    #[test]
    fn batcher_matches_reference_and_ends_every_operation_once(
        data in common::bytes(20)
    ) {
        prop_assert_eq!(check(&data), Ok(()));
    }
}
