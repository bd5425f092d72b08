#![no_main]
// One checker, two drivers: the same decoder and naive reference that proptest drives
// (the gRPC retry throttle and the Finagle budget).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(divergence) = throttle_sansio::model::failover::check_budget(data) {
        panic!("{divergence}");
    }
});
