//! Shared proptest settings: no failure files (miri has no file system to spare), and a
//! handful of cases under miri, where every case is slow.

use proptest::test_runner::Config;

/// The proptest configuration every model test uses.
pub fn config() -> Config {
    Config {
        cases: if cfg!(miri) { 4 } else { 512 },
        failure_persistence: None,
        ..Config::default()
    }
}

/// Longest byte string fed to a checker (shorter under miri).
pub const MAX_LEN: usize = if cfg!(miri) { 96 } else { 2048 };
