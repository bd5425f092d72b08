//! Memory of keyed state, measured as bytes live under a counting global allocator (requested
//! sizes, not the allocator's rounding). Not a criterion bench: it measures once and writes
//! `<criterion dir>/memory/results.json`, which `tests/benches/report.py` reads beside
//! criterion's estimates.
//!
//! Run with the rest: `cargo bench -p throttle-tests --features bench`.

#[path = "../support/counting_alloc.rs"]
mod counting_alloc;
#[path = "../support/workloads.rs"]
mod workloads;

use std::collections::{BTreeMap, VecDeque};
use std::hash::RandomState;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use counting_alloc::{Counting, count_allocs, live_bytes};
use throttle_sansio::batcher::{Batcher, BatcherConfig};
use throttle_sansio::time::Instant;

#[global_allocator]
static GLOBAL: Counting = Counting;

const KEYS: u64 = 1_000_000;

/// Where criterion writes (the same order of lookups as criterion's own).
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/criterion")
}

/// A spread of u64 bucket ids.
fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xABCD
}

fn gate(results: &mut BTreeMap<String, f64>) {
    use throttle_sansio::write_gate::{Reason, WriteGate, WriteGateConfig};

    let now = Instant::from_millis(1_000);
    let before = live_bytes();
    let mut gate: WriteGate<u64, RandomState> =
        WriteGate::new(WriteGateConfig::default()).expect("the default config is valid");
    let empty = live_bytes().saturating_sub(before);
    for i in 0..KEYS {
        // Deadlines spread over 1..=1000 ms.
        let delay = Duration::from_millis(1 + i % 1000);
        black_box(
            gate.handle_throttle(now, &key(i), Reason::KV_BACKPRESSURE, delay)
                .expect("built-in reason"),
        );
    }
    while gate.poll_action().is_some() {}
    let full = live_bytes().saturating_sub(before);
    assert_eq!(gate.gated_len(), KEYS as usize);
    // Every gate expires; handle_timeout evicts them all and shrinks the maps.
    gate.handle_timeout(now + Duration::from_secs(2));
    assert!(gate.is_empty());
    let after = live_bytes().saturating_sub(before);
    results.insert("gate_empty_bytes".into(), empty as f64);
    results.insert(
        "gate_bytes_per_bucket".into(),
        (full.saturating_sub(empty)) as f64 / KEYS as f64,
    );
    results.insert("gate_after_expiry_bytes".into(), after as f64);
    drop(gate);
}

fn governor(results: &mut BTreeMap<String, f64>) {
    use governor::clock::FakeRelativeClock;
    use governor::state::keyed::DashMapStateStore;
    use governor::{Quota, RateLimiter};
    type GovernorKeyed = RateLimiter<
        u64,
        DashMapStateStore<u64>,
        FakeRelativeClock,
        governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
    >;

    let before = live_bytes();
    let clock = FakeRelativeClock::default();
    let quota = Quota::per_second(NonZeroU32::new(1).expect("nonzero"));
    let limiter: GovernorKeyed =
        RateLimiter::new(quota, DashMapStateStore::default(), clock.clone());
    let empty = live_bytes().saturating_sub(before);
    for i in 0..KEYS {
        black_box(limiter.check_key(&key(i)).is_ok());
    }
    let full = live_bytes().saturating_sub(before);
    assert_eq!(limiter.len(), KEYS as usize);
    // Every key's state is back to "fresh": governor's own eviction, then shrink.
    clock.advance(Duration::from_secs(10));
    limiter.retain_recent();
    limiter.shrink_to_fit();
    let after = live_bytes().saturating_sub(before);
    assert_eq!(limiter.len(), 0);
    results.insert("governor_empty_bytes".into(), empty as f64);
    results.insert(
        "governor_bytes_per_key".into(),
        (full.saturating_sub(empty)) as f64 / KEYS as f64,
    );
    results.insert("governor_after_expiry_bytes".into(), after as f64);
    drop(limiter);
}

/// Allocations per operation of the batcher bench's round, after two warm-up rounds (the same
/// workload as `batcher/*` in the criterion bench; must be zero).
fn batcher_allocs(results: &mut BTreeMap<String, f64>) {
    const OPS: u64 = 10_000;
    for (name, shards) in [("1_shard", 1u32), ("1000_shards", 1000)] {
        let mut b: Batcher<u32, u64, RandomState> = Batcher::new(BatcherConfig::writes());
        let mut in_flight = VecDeque::with_capacity(4096);
        for _ in 0..2 {
            workloads::batcher_round(&mut b, &mut in_flight, shards, OPS);
        }
        let (n, delivered) =
            count_allocs(|| workloads::batcher_round(&mut b, &mut in_flight, shards, OPS));
        assert_eq!(delivered, OPS);
        results.insert(
            format!("batcher_{name}_allocs_per_op"),
            n as f64 / OPS as f64,
        );
    }
}

/// Bytes of a `WindowHandle`: empty, then holding one permit on each of 128 shards (the
/// two-thread bench's shard set), then with those released (their idle entries kept).
fn window_handle(results: &mut BTreeMap<String, f64>) {
    use throttle_sansio::WindowConfig;
    use throttle_sansio::sync::WindowHandle;

    let before = live_bytes();
    let handle: WindowHandle<u32> =
        WindowHandle::new(WindowConfig::default()).expect("the default config is valid");
    let empty = live_bytes().saturating_sub(before);
    let permits: Vec<_> = (0..128u32)
        .map(|k| handle.try_acquire_owned(k).expect("a free credit"))
        .collect();
    let held = live_bytes().saturating_sub(before);
    drop(permits);
    results.insert("window_handle_empty_bytes".into(), empty as f64);
    results.insert("window_handle_128_shards_bytes".into(), held as f64);
    drop(handle);
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: measure only when
    // benchmarking, like criterion.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let mut results = BTreeMap::new();
    gate(&mut results);
    governor(&mut results);
    batcher_allocs(&mut results);
    window_handle(&mut results);

    let dir = criterion_dir().join("memory");
    std::fs::create_dir_all(&dir).expect("create the memory results dir");
    let mut json = String::from("{\n");
    let n = results.len();
    for (i, (k, v)) in results.iter().enumerate() {
        json.push_str(&format!(
            "  \"{k}\": {v}{}\n",
            if i + 1 < n { "," } else { "" }
        ));
    }
    json.push_str("}\n");
    let path = dir.join("results.json");
    std::fs::write(&path, json).expect("write memory results");
    for (k, v) in &results {
        println!("memory/{k}: {v:.1}");
    }
    println!("wrote {}", path.display());
}
