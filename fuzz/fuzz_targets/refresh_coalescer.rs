#![no_main]
// One checker, two drivers: the same decoder and naive reference that proptest drives
// (the refresh coalescer alone).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(divergence) = throttle_sansio::model::failover::check_coalescer(data) {
        panic!("{divergence}");
    }
});
