#![no_main]
// One checker, two drivers: the same decoder and naive reference that proptest drives
// (calls that share one refresh coalescer; error causes, per-cause backoffs and the causes
// reported to the budget).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(divergence) = throttle_sansio::model::failover::check_call(data) {
        panic!("{divergence}");
    }
});
