#![no_main]
// One checker, two drivers: the same decoder and naive reference that proptest drives
// (the gRPC retry throttle with config replacement, the Finagle budget with its epoch-shifted
// and TTL-scaled twins, and the AWS standard-mode retry quota).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(divergence) = throttle_sansio::model::failover::check_budget(data) {
        panic!("{divergence}");
    }
});
