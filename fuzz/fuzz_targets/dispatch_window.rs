#![no_main]
// One checker, two drivers: the same decoder and naive reference that proptest drives, over
// the multi-shard window and then the single-shard window.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(divergence) = throttle_sansio::model::dispatch_window::check_all(data) {
        panic!("{divergence}");
    }
});
