//! Scenario 3 (read batching), CI-sized. Upstream (Oxia, max-rate reads, 10k outstanding):
//! 34× fewer read RPCs (1.50 M → 43.6 k), batches pinned at the 1000 cap.

use throttle_tests::sim::reads::{ReadParams, compare};

#[test]
fn window_of_four_sends_twenty_times_fewer_rpcs_with_batches_at_the_cap() {
    let p = ReadParams {
        total_reads: 400_000,
        ..ReadParams::full(1.0)
    };
    let r = compare(&p, 1);
    assert_eq!(r.naive.reads, r.ours.reads);
    assert!(
        r.ours.rpcs * 20 <= r.naive.rpcs,
        "ours {} vs naive {}",
        r.ours.rpcs,
        r.naive.rpcs
    );
    assert!(r.ours.reads_per_rpc() >= 990.0, "{:?}", r.ours);
    assert_eq!(r.ours.max_batch, 1000);
    assert!(r.ours.p99 <= r.naive.p99, "{r:?}");
}
