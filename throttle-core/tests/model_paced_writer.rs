#![cfg(feature = "model")]
//! proptest driver for the paced-writer model checker.

mod common;

use proptest::prelude::*;
use throttle_sansio::model::paced_writer::{SELECTORS, check};

proptest! {
    #![proptest_config(common::config())]

    /// Every drain sends exactly the reference's open buckets' head batches, grouped per
    /// node; answers end, re-queue or refuse as the reference says; no send of a gated or
    /// probing bucket; attempts within max_retries; poll_timeout is the earliest reopening
    /// and later than the drain; every record ends exactly once, FIFO per bucket; a bucket
    /// callback that panics changes nothing (or, in a drain, keeps only allowed sends).
    #[test]
    fn paced_writer_matches_reference_and_ends_every_record_once(
        data in common::bytes(SELECTORS)
    ) {
        prop_assert_eq!(check(&data), Ok(()));
    }
}
