#![no_main]
// One checker, two drivers: the same decoder and naive reference that proptest drives
// (calls sharing a coalescer, the coalescer alone, both retry budgets).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(divergence) = throttle_core::model::failover::check(data) {
        panic!("{divergence}");
    }
});
