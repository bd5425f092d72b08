//! Per-client random streams: a per-process random source mixed with a client id.
//!
//! Jitter only spreads a fleet if no two clients draw the same sequence. Each driver and each
//! handle that draws on its own seeds its generator from [`client_rng`], so two clients in
//! one process differ by their id, and two processes differ by their process seed even with
//! equal ids.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::rng::SplitMix64;

/// A seed drawn once per process from std's randomly keyed hasher (the OS's randomness).
pub fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        use core::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    })
}

/// A client id unique within this process (a counter), for clients the user does not name.
pub fn next_client_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The generator of client `client_id`: the process seed mixed with the id through one
/// SplitMix64 finalizer step, so neighbouring ids give unrelated streams.
pub fn client_rng(client_id: u64) -> SplitMix64 {
    SplitMix64::new(mix(process_seed(), client_id))
}

/// SplitMix64's finalizer over `seed ^ id·φ`: a bijection in `id` for a fixed seed.
fn mix(seed: u64, id: u64) -> u64 {
    crate::rng::finalize(seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn clients_in_one_process_draw_different_streams_and_one_client_is_stable() {
        let mut seen = std::collections::HashSet::new();
        for id in 0..1_000 {
            assert!(
                seen.insert(client_rng(id).next_u64()),
                "id {id} repeats a stream"
            );
        }
        assert_eq!(client_rng(7).next_u64(), client_rng(7).next_u64());
        assert_eq!(process_seed(), process_seed());
    }

    #[test]
    fn the_mix_depends_on_the_process_seed() {
        assert_ne!(mix(1, 5), mix(2, 5));
        assert_ne!(mix(1, 5), mix(1, 6));
    }

    #[test]
    fn client_ids_are_unique() {
        let a = next_client_id();
        let b = next_client_id();
        assert_ne!(a, b);
    }
}
