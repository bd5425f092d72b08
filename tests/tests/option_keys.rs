//! `ConfigError::display_with`: a refusal names the caller's option keys (`OptionKeys`) where
//! it would name ours, falls back to ours for an option the caller did not map, and cannot
//! panic whatever the mapping holds.

use std::fmt::{self, Write as _};
use std::panic::catch_unwind;
use std::time::Duration;

use throttle_sansio::options::{self, ConfigOption, OptionKeys};
use throttle_sansio::{BackoffConfig, ConfigError, PacedWriterConfig};

/// The three variants naming `option` (and `limit` for `Inverted`).
fn variants(option: &'static ConfigOption, limit: &'static ConfigOption) -> [ConfigError; 3] {
    [
        ConfigError::OutOfRange {
            option,
            got: 0,
            min: 1,
            max: 2,
            unit: "ms",
        },
        ConfigError::Inverted { option, limit },
        ConfigError::Invalid {
            option,
            reason: "is wrong",
        },
    ]
}

/// Everything our own message says about `option`: none of it may appear once it is mapped.
fn assert_names_none_of_ours(msg: &str, option: &ConfigOption) {
    assert!(!msg.contains(&format!("`{}`", option.name())), "{msg}");
    assert!(!msg.contains(option.method()), "{msg}");
    assert!(!msg.contains("no upstream key"), "{msg}");
    assert!(!msg.contains('('), "no parenthesis of ours: {msg}");
    for key in option.upstream() {
        assert!(!msg.contains(key.key()), "{msg}");
    }
}

#[test]
fn every_variant_names_the_callers_keys_and_none_of_ours() {
    let keys: Vec<String> = (0..options::ALL.len())
        .map(|i| format!("caller_key_{i}"))
        .collect();
    let entries: Vec<(&ConfigOption, &str)> = options::ALL
        .iter()
        .zip(&keys)
        .map(|(&o, k)| (o, k.as_str()))
        .collect();
    let mapping = OptionKeys::new(&entries);
    let n = options::ALL.len();
    for (i, &option) in options::ALL.iter().enumerate() {
        let limit = options::ALL[(i + 1) % n];
        let (key, limit_key) = (&keys[i], &keys[(i + 1) % n]);
        assert_eq!(mapping.key(option), Some(key.as_str()));
        let [range, inverted, invalid] = variants(option, limit);
        let shown = |e: &ConfigError| e.display_with(mapping).to_string();
        assert_eq!(shown(&range), format!("`{key}` = 0 ms is outside 1..=2 ms"));
        assert_eq!(
            shown(&inverted),
            format!("`{key}` must not exceed `{limit_key}`")
        );
        assert_eq!(shown(&invalid), format!("`{key}`: is wrong"));
        for e in [range, inverted, invalid] {
            assert_names_none_of_ours(&shown(&e), option);
            assert_names_none_of_ours(&shown(&e), limit);
        }
    }
}

#[test]
fn an_unmapped_option_is_named_as_display_names_it() {
    let other = [(&options::failover::MAX_WAITERS, "coalescer_waiters")];
    for &option in options::ALL {
        for e in variants(option, &options::backoff::MAX) {
            let ours = e.to_string();
            assert_eq!(e.display_with(OptionKeys::NONE).to_string(), ours);
            assert_eq!(e.display_with(OptionKeys::default()).to_string(), ours);
            if option != &options::failover::MAX_WAITERS {
                assert_eq!(e.display_with(OptionKeys::new(&other)).to_string(), ours);
            }
        }
    }
    // The general row is not the preset's row: mapping one leaves the other ours.
    let preset = [(
        &options::backoff::FLUSS_RETRY_INITIAL,
        "writer_retry_backoff_ms",
    )];
    assert_eq!(
        OptionKeys::new(&preset).key(&options::backoff::INITIAL),
        None
    );

    // `Inverted` with one side mapped: the other keeps its name and its parenthesis.
    let (initial, max) = (&options::backoff::INITIAL, &options::backoff::MAX);
    let e = ConfigError::Inverted {
        option: initial,
        limit: max,
    };
    let only_option = [(initial, "retry_initial")];
    assert_eq!(
        e.display_with(OptionKeys::new(&only_option)).to_string(),
        "`retry_initial` must not exceed `max` (limit `BackoffConfigBuilder::max`; no upstream key)"
    );
    let only_limit = [(max, "retry_max")];
    assert_eq!(
        e.display_with(OptionKeys::new(&only_limit)).to_string(),
        "`initial` must not exceed `retry_max` (`BackoffConfigBuilder::initial`; no upstream key)"
    );
}

#[test]
fn fluss_writer_keys_name_real_refusals() {
    let fluss = OptionKeys::new(&[
        (
            &options::backoff::FLUSS_RETRY_INITIAL,
            "writer_retry_backoff_ms",
        ),
        (
            &options::backoff::FLUSS_RETRY_MAX,
            "writer_retry_max_backoff_ms",
        ),
        (&options::paced_writer::BATCH_BYTES, "writer_batch_size"),
        (&options::paced_writer::MAX_RETRIES, "writer_retries"),
    ]);
    let err = BackoffConfig::fluss_retriable_write()
        .to_builder()
        .max(Duration::from_secs(1u64 << 32))
        .build()
        .unwrap_err();
    // (Fluss Rust's own field names are our upstream keys for these rows, so the whole
    // message is compared.)
    assert_eq!(
        err.display_with(fluss).to_string(),
        "`writer_retry_max_backoff_ms` = 4294967296000000000 ns is outside \
         0..=2147483647000000 ns"
    );
    assert!(err.to_string().contains("`BackoffConfigBuilder::max`"));

    let err = BackoffConfig::fluss_retriable_write()
        .to_builder()
        .initial(Duration::from_secs(2))
        .build()
        .unwrap_err();
    assert_eq!(
        err.display_with(fluss).to_string(),
        "`writer_retry_backoff_ms` must not exceed `writer_retry_max_backoff_ms`"
    );

    let err = PacedWriterConfig::default()
        .with_batch_bytes(0)
        .validate()
        .unwrap_err();
    let msg = err.display_with(fluss).to_string();
    assert!(msg.starts_with("`writer_batch_size` = 0 bytes"), "{msg}");
    assert_names_none_of_ours(&msg, &options::paced_writer::BATCH_BYTES);
}

/// A sink that refuses every write after `budget` bytes.
struct Failing(usize);
impl fmt::Write for Failing {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 = self.0.checked_sub(s.len()).ok_or(fmt::Error)?;
        Ok(())
    }
}

#[test]
fn no_mapping_makes_display_panic() {
    let all: Vec<(&ConfigOption, &str)> = options::ALL.iter().map(|&o| (o, "")).collect();
    let odd = [
        (&options::backoff::MAX, "{}{0}`)(\u{0}é🦀"),
        (&options::backoff::MAX, "second entry: never used"),
        (&options::window::MAX_IN_FLIGHT, "\n"),
    ];
    let mappings = [
        OptionKeys::NONE,
        OptionKeys::new(&all),
        OptionKeys::new(&odd),
    ];
    // Duplicates: the first entry wins.
    assert_eq!(
        OptionKeys::new(&odd).key(&options::backoff::MAX),
        Some("{}{0}`)(\u{0}é🦀")
    );
    for keys in mappings {
        for &option in options::ALL {
            for &limit in options::ALL {
                let errors = [
                    ConfigError::OutOfRange {
                        option,
                        got: u64::MAX,
                        min: u64::MAX,
                        max: 0,
                        unit: "",
                    },
                    ConfigError::Inverted { option, limit },
                    ConfigError::Invalid { option, reason: "" },
                ];
                for e in errors {
                    let shown = catch_unwind(|| {
                        let full = e.display_with(keys).to_string();
                        // A sink failing part-way gets the error back, not a panic.
                        for budget in [0, 1, full.len() / 2] {
                            let r = write!(Failing(budget), "{}", e.display_with(keys));
                            assert!(r.is_err() || budget >= full.len());
                        }
                        full
                    });
                    let shown = shown.expect("display_with never panics");
                    if let Some(key) = keys.key(option) {
                        assert!(shown.starts_with(&format!("`{key}`")), "{shown}");
                    }
                }
            }
        }
    }
}
