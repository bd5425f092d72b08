//! Scenario 2 (KV backpressure), CI-sized. Fluss issue #3454: piggybacked pressure with a
//! cubic ramp lets clients absorb L0 growth before the hard rejection at `Tr`, "making the
//! transition between throttle and rejection continuous".

use throttle_tests::sim::kv::{KvParams, compare};

#[test]
fn p3_ramp_avoids_hard_rejections_at_comparable_throughput() {
    let r = compare(&KvParams::full(0.5), 1);
    assert!(
        r.naive.rejections >= 100,
        "naive must hit Tr: {:?}",
        r.naive
    );
    assert!(
        r.ours.rejections * 20 <= r.naive.rejections,
        "ours {} vs naive {}",
        r.ours.rejections,
        r.naive.rejections
    );
    assert!(r.ours.stalled_for * 10 <= r.naive.stalled_for, "{r:?}");
    assert!(r.ours.peak_l0 < 20, "ours never reaches Tr: {:?}", r.ours);
    // Same bytes delivered, at least 90 % of the naive client's throughput.
    assert_eq!(r.ours.bytes_acked, r.naive.bytes_acked);
    assert!(r.ours.throughput() >= 0.9 * r.naive.throughput(), "{r:?}");
}
