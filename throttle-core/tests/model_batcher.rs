#![cfg(feature = "model")]
//! proptest driver for the batcher model checker.

mod common;

use proptest::prelude::*;
use throttle_sansio::model::batcher::check;

/// Operation values the batcher decoder assigns (`model::batcher`: 0 to 23).
const SELECTORS: u8 = 24;

/// The decoder's first-operation value that sets the operation timeout and oversized
/// rejection (`model::batcher::OPTIONS`).
const OPTIONS: u8 = 20;

proptest! {
    #![proptest_config(common::config())]

    /// Every operation ends exactly once or is withdrawn once (only before its batch left),
    /// batches leave FIFO per shard with the reference's cuts, at most `max_in_flight` per
    /// shard, an emptied batch never leaves, and idle shards hold no state.
    #[test]
    fn batcher_matches_reference_and_ends_every_operation_once(
        data in common::bytes(SELECTORS)
    ) {
        prop_assert_eq!(check(&data), Ok(()));
    }

    /// The same with an operation timeout and oversized rejection chosen by the first
    /// operation: held operations time out exactly at their deadlines, a sent batch carries
    /// its oldest operation's, and the timer never sleeps past a held deadline.
    #[test]
    fn batcher_with_timeouts_and_rejection_matches_reference(
        head in proptest::collection::vec(any::<u8>(), 4),
        options in any::<u8>(),
        data in common::bytes(SELECTORS)
    ) {
        let mut input = head;
        input.extend([OPTIONS, options]);
        input.extend(data);
        prop_assert_eq!(check(&input), Ok(()));
    }
}
