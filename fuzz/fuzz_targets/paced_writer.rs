#![no_main]
// One checker, two drivers: the same decoder and naive reference that proptest drives.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(divergence) = throttle_sansio::model::paced_writer::check(data) {
        panic!("{divergence}");
    }
});
