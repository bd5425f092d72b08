//! Shared proptest settings: no failure files (miri has no file system to spare), and a
//! handful of cases under miri, where every case is slow.

use proptest::prelude::*;
use proptest::test_runner::Config;

/// The proptest configuration every model test uses.
pub fn config() -> Config {
    Config {
        cases: if cfg!(miri) { 3 } else { 512 },
        failure_persistence: None,
        ..Config::default()
    }
}

/// Longest byte string fed to a checker (shorter under miri).
pub const MAX_LEN: usize = if cfg!(miri) { 96 } else { 2048 };

/// Input bytes for a checker whose selectors have at most `selectors` assigned values.
///
/// Decoders read operation and variant selectors as single bytes, and a value past the
/// assigned ones is a no-op (`docs/verification.md`, "Stable decoders"), so uniform bytes
/// would spend most of an input on no-ops. Two bytes in three are drawn below `selectors`
/// instead; the third is any byte, so parameters still reach their extremes.
pub fn bytes(selectors: u8) -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![2 => 0..selectors.max(1), 1 => any::<u8>()];
    proptest::collection::vec(byte, 0..MAX_LEN)
}

/// The same bias for long deterministic inputs: a byte from one generator word.
#[allow(dead_code)] // each test crate includes this module; not all of them use every item
pub fn biased_byte(word: u64, selectors: u8) -> u8 {
    let b = (word >> 24) as u8;
    if word % 3 == 2 {
        b
    } else {
        b % selectors.max(1)
    }
}
