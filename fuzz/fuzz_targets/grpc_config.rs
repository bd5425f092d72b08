#![no_main]
// One checker, two drivers: the same decoder and field-level reference that the core's unit
// tests drive (the gRPC service-config parsers).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(divergence) = throttle_sansio::model::grpc_config::check(data) {
        panic!("{divergence}");
    }
});
