#![no_main]
// One checker, two drivers: the same decoder and naive reference that proptest drives
// (AIMD and Gradient2, with and without the sample window, and invalid configurations).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(divergence) = throttle_sansio::model::limiter::check(data) {
        panic!("{divergence}");
    }
});
