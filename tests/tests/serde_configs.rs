//! The `serde` feature (`docs/serde.md`): every preset round-trips through its mirror and
//! JSON, `docs/presets/` holds exactly one file per preset and each equals its preset, the
//! field names are the option table's, and a malformed file is an error naming the field.
//!
//! `THROTTLE_BLESS_PRESETS=1 cargo test -p throttle-tests --test serde_configs` rewrites
//! `docs/presets/` from the code.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use throttle_sansio::backoff::BackoffConfig;
use throttle_sansio::backpressure::{PressureConfig, ThrottleCurve};
use throttle_sansio::batcher::BatcherConfig;
use throttle_sansio::conn_key::ConnConfig;
use throttle_sansio::dispatch_window::WindowConfig;
use throttle_sansio::failover::{
    AwsRetryQuotaConfig, CallConfig, CoalescerConfig, FinagleBudgetConfig, GrpcThrottleConfig,
};
use throttle_sansio::limiter::{AimdConfig, Gradient2Config, LimiterConfig, SampleWindowConfig};
use throttle_sansio::mirror::{
    AimdConfigMirror, AwsRetryQuotaConfigMirror, BackoffConfigMirror, BatcherConfigMirror,
    CallConfigMirror, CoalescerConfigMirror, ConnConfigMirror, FinagleBudgetConfigMirror,
    Gradient2ConfigMirror, GrpcThrottleConfigMirror, LimiterConfigMirror, PacedWriterConfigMirror,
    PendingBytesConfigMirror, PressureConfigMirror, SampleWindowConfigMirror, ThrottleCurveMirror,
    WindowConfigMirror, WriteGateConfigMirror,
};
use throttle_sansio::options;
use throttle_sansio::paced_writer::PacedWriterConfig;
use throttle_sansio::pending_bytes::PendingBytesConfig;
use throttle_sansio::write_gate::{Reason, ReasonSpec, UpdateRule, WriteGateConfig};

/// One preset: its file's stem, and the checks that need its types.
struct Preset {
    file: &'static str,
    /// The round trip config -> mirror -> JSON -> mirror -> config, and the config's own
    /// impls; panics on a difference.
    round_trip: fn(),
    /// The preset as its file holds it.
    json: fn() -> String,
    /// Parses a file's text and compares it with the preset.
    check_file: fn(&str) -> Result<(), String>,
}

/// config -> mirror -> JSON -> mirror -> config, and config -> JSON -> config; both must give
/// the original (compared by `same`).
fn round_trip<C, M>(cfg: C, same: fn(&C, &C) -> bool)
where
    C: Serialize + DeserializeOwned + Debug,
    M: Serialize + DeserializeOwned + Debug,
    for<'a> M: TryFrom<&'a C>,
    for<'a> <M as TryFrom<&'a C>>::Error: Debug,
    C: TryFrom<M>,
    <C as TryFrom<M>>::Error: Debug,
{
    let mirror = M::try_from(&cfg).expect("a preset converts to its mirror");
    let json = serde_json::to_string_pretty(&mirror).expect("a mirror serialises");
    let back: M = serde_json::from_str(&json).expect("its own JSON parses");
    let again = C::try_from(back).expect("its own mirror validates");
    assert!(
        same(&cfg, &again),
        "{cfg:?}\n!=\n{again:?}\nthrough\n{json}"
    );
    let direct = serde_json::to_string(&cfg).expect("a preset serialises");
    let direct: C = serde_json::from_str(&direct).expect("its own JSON parses");
    assert!(same(&cfg, &direct), "{cfg:?}\n!=\n{direct:?}");
}

fn eq<C: PartialEq>(a: &C, b: &C) -> bool {
    a == b
}

/// For the configurations without `PartialEq`: every field shows in `Debug`.
fn debug_eq<C: Debug>(a: &C, b: &C) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

fn json_of<C: Serialize>(cfg: C) -> String {
    serde_json::to_string_pretty(&cfg).expect("a preset serialises") + "\n"
}

fn check_text<C: DeserializeOwned + Debug>(
    text: &str,
    preset: C,
    same: fn(&C, &C) -> bool,
) -> Result<(), String> {
    let read: C = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if same(&read, &preset) {
        Ok(())
    } else {
        Err(format!("{read:?}\n!=\n{preset:?}"))
    }
}

macro_rules! preset {
    ($file:literal, $config:ty, $mirror:ty, $same:ident, $make:expr) => {
        Preset {
            file: $file,
            round_trip: || round_trip::<$config, $mirror>($make, $same),
            json: || json_of::<$config>($make),
            check_file: |text| check_text::<$config>(text, $make, $same),
        }
    };
}

/// Every named constructor of every configuration, and every `Default`.
fn presets() -> Vec<Preset> {
    vec![
        preset!(
            "backoff.default",
            BackoffConfig,
            BackoffConfigMirror,
            eq,
            BackoffConfig::default()
        ),
        preset!(
            "backoff.fluss_disk_write_locked",
            BackoffConfig,
            BackoffConfigMirror,
            eq,
            BackoffConfig::fluss_disk_write_locked()
        ),
        preset!(
            "backoff.fluss_retriable_write",
            BackoffConfig,
            BackoffConfigMirror,
            eq,
            BackoffConfig::fluss_retriable_write()
        ),
        preset!(
            "backoff.kafka_retry",
            BackoffConfig,
            BackoffConfigMirror,
            eq,
            BackoffConfig::kafka_retry()
        ),
        preset!(
            "backoff.grpc_connection",
            BackoffConfig,
            BackoffConfigMirror,
            eq,
            BackoffConfig::grpc_connection()
        ),
        preset!(
            "backoff.gobblin_throttling_client",
            BackoffConfig,
            BackoffConfigMirror,
            eq,
            BackoffConfig::gobblin_throttling_client()
        ),
        preset!(
            "backoff.builder",
            BackoffConfig,
            BackoffConfigMirror,
            eq,
            BackoffConfig::builder()
                .build()
                .expect("the builder's start is valid")
        ),
        preset!(
            "pressure.default",
            PressureConfig,
            PressureConfigMirror,
            eq,
            PressureConfig::default()
        ),
        preset!(
            "pressure.fluss_landed",
            PressureConfig,
            PressureConfigMirror,
            eq,
            PressureConfig::fluss_landed()
        ),
        preset!(
            "pressure.fluss_issue_3454",
            PressureConfig,
            PressureConfigMirror,
            eq,
            PressureConfig::fluss_issue_3454()
        ),
        preset!(
            "throttle_curve.default",
            ThrottleCurve,
            ThrottleCurveMirror,
            eq,
            ThrottleCurve::default()
        ),
        preset!(
            "throttle_curve.fluss_landed",
            ThrottleCurve,
            ThrottleCurveMirror,
            eq,
            ThrottleCurve::fluss_landed()
        ),
        preset!(
            "throttle_curve.fluss_issue_3454",
            ThrottleCurve,
            ThrottleCurveMirror,
            eq,
            ThrottleCurve::fluss_issue_3454()
        ),
        preset!(
            "write_gate.default",
            WriteGateConfig,
            WriteGateConfigMirror,
            debug_eq,
            WriteGateConfig::default()
        ),
        preset!(
            "write_gate.fluss_landed",
            WriteGateConfig,
            WriteGateConfigMirror,
            debug_eq,
            WriteGateConfig::fluss_landed()
        ),
        preset!(
            "write_gate.fluss_issue_3454",
            WriteGateConfig,
            WriteGateConfigMirror,
            debug_eq,
            WriteGateConfig::fluss_issue_3454()
        ),
        preset!(
            "paced_writer.default",
            PacedWriterConfig,
            PacedWriterConfigMirror,
            debug_eq,
            PacedWriterConfig::default()
        ),
        preset!(
            "window.default",
            WindowConfig,
            WindowConfigMirror,
            eq,
            WindowConfig::default()
        ),
        preset!(
            "aimd.default",
            AimdConfig,
            AimdConfigMirror,
            eq,
            AimdConfig::default()
        ),
        preset!(
            "gradient2.default",
            Gradient2Config,
            Gradient2ConfigMirror,
            eq,
            Gradient2Config::default()
        ),
        preset!(
            "sample_window.default",
            SampleWindowConfig,
            SampleWindowConfigMirror,
            eq,
            SampleWindowConfig::default()
        ),
        preset!(
            "limiter.aimd",
            LimiterConfig,
            LimiterConfigMirror,
            eq,
            LimiterConfig::aimd(AimdConfig::default())
        ),
        preset!(
            "limiter.gradient2",
            LimiterConfig,
            LimiterConfigMirror,
            eq,
            LimiterConfig::gradient2(Gradient2Config::default())
        ),
        preset!(
            "batcher.default",
            BatcherConfig,
            BatcherConfigMirror,
            eq,
            BatcherConfig::default()
        ),
        preset!(
            "batcher.writes",
            BatcherConfig,
            BatcherConfigMirror,
            eq,
            BatcherConfig::writes()
        ),
        preset!(
            "batcher.reads",
            BatcherConfig,
            BatcherConfigMirror,
            eq,
            BatcherConfig::reads()
        ),
        preset!(
            "pending_bytes.default",
            PendingBytesConfig,
            PendingBytesConfigMirror,
            eq,
            PendingBytesConfig::default()
        ),
        preset!(
            "pending_bytes.disabled",
            PendingBytesConfig,
            PendingBytesConfigMirror,
            eq,
            PendingBytesConfig::disabled()
        ),
        preset!(
            "conn.default",
            ConnConfig,
            ConnConfigMirror,
            eq,
            ConnConfig::default()
        ),
        preset!(
            "call.default",
            CallConfig,
            CallConfigMirror,
            eq,
            CallConfig::default()
        ),
        preset!(
            "call.fluss_admin",
            CallConfig,
            CallConfigMirror,
            eq,
            CallConfig::fluss_admin()
        ),
        preset!(
            "coalescer.default",
            CoalescerConfig,
            CoalescerConfigMirror,
            eq,
            CoalescerConfig::default()
        ),
        preset!(
            "coalescer.fluss_unbounded",
            CoalescerConfig,
            CoalescerConfigMirror,
            eq,
            CoalescerConfig::fluss_unbounded()
        ),
        preset!(
            "grpc_throttle.default",
            GrpcThrottleConfig,
            GrpcThrottleConfigMirror,
            eq,
            GrpcThrottleConfig::default()
        ),
        preset!(
            "grpc_throttle.grpc_a6_example",
            GrpcThrottleConfig,
            GrpcThrottleConfigMirror,
            eq,
            GrpcThrottleConfig::grpc_a6_example()
        ),
        preset!(
            "finagle_budget.default",
            FinagleBudgetConfig,
            FinagleBudgetConfigMirror,
            eq,
            FinagleBudgetConfig::default()
        ),
        preset!(
            "finagle_budget.finagle_default",
            FinagleBudgetConfig,
            FinagleBudgetConfigMirror,
            eq,
            FinagleBudgetConfig::finagle_default()
        ),
        preset!(
            "aws_retry_quota.default",
            AwsRetryQuotaConfig,
            AwsRetryQuotaConfigMirror,
            eq,
            AwsRetryQuotaConfig::default()
        ),
        preset!(
            "aws_retry_quota.aws_standard",
            AwsRetryQuotaConfig,
            AwsRetryQuotaConfigMirror,
            eq,
            AwsRetryQuotaConfig::aws_standard()
        ),
        preset!(
            "aws_retry_quota.aws_standard_2026",
            AwsRetryQuotaConfig,
            AwsRetryQuotaConfigMirror,
            eq,
            AwsRetryQuotaConfig::aws_standard_2026()
        ),
    ]
}

fn presets_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/presets")
}

#[test]
fn every_preset_round_trips_through_its_mirror_and_json() {
    for preset in presets() {
        (preset.round_trip)();
    }
}

#[test]
fn the_preset_files_are_the_presets() {
    let dir = presets_dir();
    let presets = presets();
    if std::env::var_os("THROTTLE_BLESS_PRESETS").is_some() {
        std::fs::create_dir_all(&dir).expect("docs/presets is writable");
        for preset in &presets {
            let path = dir.join(format!("{}.json", preset.file));
            std::fs::write(path, (preset.json)()).expect("docs/presets is writable");
        }
    }
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("docs/presets exists")
        .map(|entry| {
            entry
                .expect("a readable entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let expected: BTreeSet<String> = presets.iter().map(|p| format!("{}.json", p.file)).collect();
    assert_eq!(
        on_disk, expected,
        "docs/presets must hold one file per preset (THROTTLE_BLESS_PRESETS=1 rewrites them)"
    );
    for preset in &presets {
        let path = dir.join(format!("{}.json", preset.file));
        let text = std::fs::read_to_string(&path).expect("a preset file");
        if let Err(e) = (preset.check_file)(&text) {
            panic!("{} does not read back as its preset: {e}", path.display());
        }
    }
}

/// The names of the table in `docs/options.md`, which every key must be (less a `_ms` or
/// `_ns` suffix), except these, each documented in `docs/serde.md`: the constructor a
/// backoff's rules or a batcher's kind come from, the built-in reason `kv_backpressure` (the
/// other two are options of the gate too), and the jitter strategies and their parameters.
const NOT_IN_THE_TABLE: &[&str] = &[
    "preset",
    "kind",
    "kv_backpressure",
    "proportional",
    "additive",
    "per_delay",
    "ppm",
    "range",
];

fn keys(value: &serde_json::Value, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                out.insert(key.clone());
                keys(value, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

#[test]
fn field_names_are_the_option_names() {
    let names: BTreeSet<&str> = options::ALL.iter().map(|o| o.name()).collect();
    let mut all = BTreeSet::new();
    for preset in presets() {
        let value: serde_json::Value = serde_json::from_str(&(preset.json)()).expect("JSON");
        keys(&value, &mut all);
    }
    // Every optional field too: a backoff with every limit, a batcher with a timeout, a
    // pressure config with a flush budget, a gate with the hard-rejection reason and probes,
    // a call with both backoffs.
    let extras = [
        serde_json::to_value(full_backoff()),
        serde_json::to_value(BatcherConfig::reads().with_op_timeout(Duration::from_secs(30))),
        serde_json::to_value(
            PressureConfig::builder()
                .flush_budget(64 << 20, 2)
                .build()
                .unwrap(),
        ),
        serde_json::to_value(probed_gate()),
        serde_json::to_value(windowed_limiter()),
        serde_json::to_value(
            CallConfig::fluss_admin()
                .with_backoff(BackoffConfig::kafka_retry())
                .with_throttling_backoff(BackoffConfig::kafka_retry()),
        ),
    ];
    for value in extras {
        keys(&value.expect("serialises"), &mut all);
    }
    for key in &all {
        let bare = key
            .strip_suffix("_ms")
            .or_else(|| key.strip_suffix("_ns"))
            .unwrap_or(key);
        assert!(
            names.contains(bare) || NOT_IN_THE_TABLE.contains(&bare),
            "`{key}` is not an option name of docs/options.md"
        );
    }
    // And the other way: every option of a serialised configuration has its field, so an
    // option added to a configuration without one fails here. The gRPC service config is not
    // serialised (it is read from gRPC's own JSON by `from_json`).
    for option in options::ALL {
        if option.config().starts_with("GrpcRetry") {
            continue;
        }
        let name = option.name();
        assert!(
            [name.to_string(), format!("{name}_ms"), format!("{name}_ns")]
                .iter()
                .any(|key| all.contains(key)),
            "{} `{name}` has no serialised field",
            option.config()
        );
    }
}

/// Gradient2 behind a sample window, every value off its default.
fn windowed_limiter() -> LimiterConfig {
    LimiterConfig::gradient2(
        Gradient2Config::default()
            .with_limits(1, 4, 64)
            .with_smoothing_ppm(300_000)
            .with_queue_size(2)
            .with_long_window(100)
            .with_rtt_tolerance_ppm(2_000_000),
    )
    .with_window(
        SampleWindowConfig::default()
            .with_window_time(Duration::from_millis(10), Duration::from_millis(250))
            .with_window_size(4)
            .with_min_rtt_threshold(Duration::from_micros(50)),
    )
}

#[test]
fn a_limiter_file_names_exactly_one_algorithm_and_may_add_a_window() {
    let cfg = windowed_limiter();
    let json = serde_json::to_string(&cfg).unwrap();
    assert!(json.contains("\"min_rtt_threshold_ns\":50000"), "{json}");
    assert_eq!(serde_json::from_str::<LimiterConfig>(&json).unwrap(), cfg);
    let both = r#"{"aimd": {"min": 1, "initial": 4, "max": 64, "backoff_ratio_ppm": 900000,
        "timeout_ms": 500}, "gradient2": {"min": 1, "initial": 4, "max": 64,
        "smoothing_ppm": 200000, "queue_size": 4, "long_window": 600,
        "rtt_tolerance_ppm": 1500000}}"#;
    let message = refusal::<LimiterConfig>(both);
    assert!(
        message.contains("exactly one of `aimd` and `gradient2`"),
        "{message}"
    );
    let message = refusal::<LimiterConfig>("{}");
    assert!(message.contains("exactly one"), "{message}");
    // A refused value inside the algorithm names its option.
    let bad = r#"{"aimd": {"min": 5, "initial": 4, "max": 64, "backoff_ratio_ppm": 900000,
        "timeout_ms": 500}}"#;
    assert_names(&refusal::<LimiterConfig>(bad), "initial");
    // A sub-millisecond AIMD timeout cannot be written to its `_ms` field.
    let sub_ms =
        LimiterConfig::aimd(AimdConfig::default().with_timeout(Duration::from_micros(1500)));
    let err = serde_json::to_string(&sub_ms).unwrap_err().to_string();
    assert!(err.contains("whole number of milliseconds"), "{err}");
}

/// A general backoff with every option off its default.
fn full_backoff() -> BackoffConfig {
    BackoffConfig::builder()
        .initial(Duration::from_millis(3))
        .max(Duration::from_millis(900))
        .multiplier(3, 2)
        .jitter(throttle_sansio::Jitter::Additive {
            range: Duration::from_millis(7),
        })
        .floor(Duration::from_millis(2))
        .resolution(Duration::from_micros(500))
        .total_budget(Some(Duration::from_secs(5)))
        .max_attempts(Some(9))
        .max_wait(Some(Duration::from_secs(4)))
        .first_delay_unjittered(false)
        .build()
        .expect("valid")
}

/// A gate with every option off its default: KV jitter, the hard-rejection reason, probe
/// settings.
fn probed_gate() -> WriteGateConfig {
    let mut gate = WriteGateConfig::fluss_issue_3454()
        .with_kv_jitter(200_000)
        .with_kv_hard_rejection_never_shorten()
        .unwrap();
    gate.set_probe(Reason::DISK_WRITE_LOCKED, Some(2)).unwrap();
    gate.set_probe_ttl(Reason::RETRIABLE_WRITE, Duration::from_secs(5))
        .unwrap();
    let hard = gate.kv_hard_rejection().unwrap();
    gate.set_probe(hard, Some(1)).unwrap();
    gate
}

#[test]
fn configurations_off_their_presets_round_trip_too() {
    round_trip::<BackoffConfig, BackoffConfigMirror>(full_backoff(), eq);
    // `BackoffConfig::constant` takes its delay, so it has no preset file: it is the general
    // builder's, and reads back as such.
    let constant = BackoffConfig::constant(Duration::from_millis(250)).unwrap();
    assert_eq!(
        BackoffConfigMirror::try_from(&constant).unwrap().preset,
        throttle_sansio::mirror::BackoffPreset::Builder
    );
    round_trip::<BackoffConfig, BackoffConfigMirror>(constant, eq);
    let grpc = BackoffConfig::grpc_connection()
        .to_builder()
        .jitter(throttle_sansio::Jitter::PerDelay { ppm: 1_000_000 })
        .build()
        .unwrap();
    round_trip::<BackoffConfig, BackoffConfigMirror>(grpc, eq);
    let gate = probed_gate();
    round_trip::<WriteGateConfig, WriteGateConfigMirror>(gate.clone(), debug_eq);
    let writer = PacedWriterConfig::default()
        .with_gate(gate.clone().with_wake_slack(Duration::from_millis(20)))
        .with_batch_bytes(64)
        .with_disk_backoff(false);
    round_trip::<PacedWriterConfig, PacedWriterConfigMirror>(writer.clone(), debug_eq);
    // An explicit writer slack (zero: no coalescing) is kept apart from the derived default.
    let exact = writer.with_wake_slack(Duration::ZERO);
    round_trip::<PacedWriterConfig, PacedWriterConfigMirror>(exact, debug_eq);
    let batcher = BatcherConfig::reads()
        .with_op_timeout(Duration::from_secs(30))
        .with_oversized(throttle_sansio::Oversized::Reject);
    round_trip::<BatcherConfig, BatcherConfigMirror>(batcher, eq);
    let call = CallConfig::fluss_admin()
        .with_backoff(BackoffConfig::kafka_retry())
        .with_throttling_backoff(BackoffConfig::gobblin_throttling_client());
    round_trip::<CallConfig, CallConfigMirror>(call, eq);
    let conn = ConnConfig::default()
        .with_backoff_from(throttle_sansio::BackoffFrom::Failure)
        .with_max_idle(Duration::from_millis(1));
    round_trip::<ConnConfig, ConnConfigMirror>(conn, eq);
    let pressure = PressureConfig::builder()
        .flush_budget(64 << 20, 2)
        .build()
        .unwrap();
    round_trip::<PressureConfig, PressureConfigMirror>(pressure, eq);
}

/// The error reading `json` as `C`, which must be refused.
fn refusal<C: DeserializeOwned + Debug>(json: &str) -> String {
    match serde_json::from_str::<C>(json) {
        Ok(cfg) => panic!("{json} was accepted as {cfg:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_names(message: &str, name: &str) {
    assert!(
        message.contains(&format!("`{name}`")),
        "the message does not name `{name}`: {message}"
    );
}

/// The preset file of `file` with `edit` applied to its JSON.
fn edited(
    file: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> String {
    let preset = presets()
        .into_iter()
        .find(|p| p.file == file)
        .expect("a preset");
    let mut value: serde_json::Value = serde_json::from_str(&(preset.json)()).unwrap();
    edit(value.as_object_mut().expect("an object"));
    value.to_string()
}

#[test]
fn an_unknown_field_is_refused_by_name() {
    let json = edited("window.default", |m| {
        m.insert("max_in_flihgt".into(), 8.into());
    });
    assert_names(&refusal::<WindowConfig>(&json), "max_in_flihgt");
    // In a nested configuration too.
    let json = edited("write_gate.default", |m| {
        m["disk_write_locked"]
            .as_object_mut()
            .unwrap()
            .insert("initial".into(), 1000.into());
    });
    assert_names(&refusal::<WriteGateConfig>(&json), "initial");
    let json = r#"{"max_in_flight": 4, "max_in_flight": 5}"#;
    assert_names(&refusal::<WindowConfig>(json), "max_in_flight");
}

#[test]
fn a_missing_required_field_is_refused_by_name() {
    for field in [
        "preset",
        "initial_ms",
        "resolution_ns",
        "jitter",
        "first_delay_unjittered",
    ] {
        let json = edited("backoff.kafka_retry", |m| {
            m.remove(field);
        });
        assert_names(&refusal::<BackoffConfig>(&json), field);
    }
    let json = edited("paced_writer.default", |m| {
        m.remove("gate");
    });
    assert_names(&refusal::<PacedWriterConfig>(&json), "gate");
    // An optional field may be left out: no limit.
    let json = edited("backoff.kafka_retry", |m| {
        m.remove("max_attempts");
    });
    assert!(serde_json::from_str::<BackoffConfig>(&json).is_ok());
}

#[test]
fn a_wrong_type_is_refused_by_name() {
    let cases: [(&str, &str, serde_json::Value); 8] = [
        ("aimd.default", "timeout_ms", "5000".into()),
        ("sample_window.default", "min_rtt_threshold_ns", 1.5.into()),
        ("window.default", "max_in_flight", "4".into()),
        ("backoff.default", "initial_ms", 1.5.into()),
        ("backoff.default", "first_delay_unjittered", 0.into()),
        ("backoff.default", "multiplier", 2.into()),
        ("backoff.default", "jitter_order", true.into()),
        (
            "conn.default",
            "backoff_from",
            serde_json::json!({"failure": 1}),
        ),
    ];
    for (file, field, value) in cases {
        let json = edited(file, |m| {
            m.insert(field.into(), value);
        });
        let message = match file {
            "window.default" => refusal::<WindowConfig>(&json),
            "conn.default" => refusal::<ConnConfig>(&json),
            "aimd.default" => refusal::<AimdConfig>(&json),
            "sample_window.default" => refusal::<SampleWindowConfig>(&json),
            _ => refusal::<BackoffConfig>(&json),
        };
        assert_names(&message, field);
    }
}

#[test]
fn an_out_of_range_value_is_refused_by_name() {
    // An integer outside its field's type: never wrapped or saturated.
    let json = r#"{"max_tokens": 4294967296, "milli_token_ratio": 100}"#;
    assert_names(&refusal::<GrpcThrottleConfig>(json), "max_tokens");
    let json = edited("window.default", |m| {
        m.insert("max_in_flight".into(), (-1).into());
    });
    assert_names(&refusal::<WindowConfig>(&json), "max_in_flight");
    let json = edited("batcher.default", |m| {
        m.insert("max_requests_per_batch".into(), 0.into());
    });
    assert_names(&refusal::<BatcherConfig>(&json), "max_requests_per_batch");
    // A backoff span past u64::MAX ns: refused, not counted as u64::MAX ns.
    let json = edited("backoff.builder", |m| {
        m.insert("max_ms".into(), u64::MAX.into());
    });
    let message = refusal::<BackoffConfig>(&json);
    assert_names(&message, "max");
    assert!(message.contains("18446744073709 ms"), "{message}");
    // A ceiling above the curve's u32 milliseconds: the builder's own refusal.
    let json = r#"{"exponent": 2, "max_throttle_ms": 4294967296}"#;
    assert_names(&refusal::<ThrottleCurve>(json), "max_throttle");
    // A value the configuration's validation refuses: its `ConfigError`, with the method
    // and the upstream key, from a nested configuration too.
    let json = edited("window.default", |m| {
        m.insert("max_in_flight".into(), 0.into());
    });
    let message = refusal::<WindowConfig>(&json);
    let expected = WindowConfig::default()
        .with_max_in_flight(0)
        .validate()
        .unwrap_err();
    assert!(message.starts_with(&expected.to_string()), "{message}");
    let json = edited("write_gate.fluss_landed", |m| {
        m["disk_write_locked"]["initial_ms"] = 0.into();
    });
    let message = refusal::<WriteGateConfig>(&json);
    assert_names(&message, "initial");
    assert!(
        message.contains("Fluss `client.writer.disk-write-locked.backoff`"),
        "{message}"
    );
    let json = edited("write_gate.default", |m| {
        m["reasons"]["kv_backpressure"]["probe_sends"] = 0.into();
    });
    assert_names(&refusal::<WriteGateConfig>(&json), "probe_sends");
    // An unknown name of a fieldless enum.
    let json = edited("backoff.default", |m| {
        m.insert("preset".into(), "fluss".into());
    });
    assert_names(&refusal::<BackoffConfig>(&json), "preset");
    // A jitter: an unknown strategy, a strategy's parameter of a wrong type or unknown, a
    // strategy without its parameter.
    let jitters = [
        (serde_json::json!("wobbly"), "jitter"),
        (serde_json::json!({"wobbly": {"ppm": 1}}), "jitter"),
        (serde_json::json!({"proportional": {"ppm": "x"}}), "ppm"),
        (
            serde_json::json!({"proportional": {"ppm": 1, "pmm": 1}}),
            "pmm",
        ),
        (
            serde_json::json!({"additive": {"range_ms": -1}}),
            "range_ms",
        ),
        (serde_json::json!("per_delay"), "jitter"),
    ];
    for (jitter, name) in jitters {
        let json = edited("backoff.default", |m| {
            m.insert("jitter".into(), jitter);
        });
        assert_names(&refusal::<BackoffConfig>(&json), name);
    }
}

#[test]
fn what_a_file_cannot_hold_is_refused_when_serialising() {
    // A span with a sub-millisecond part in a `_ms` field: refused, never rounded.
    let micro = BackoffConfig::builder()
        .initial(Duration::from_micros(1500))
        .build()
        .unwrap();
    let err = serde_json::to_string(&micro).unwrap_err().to_string();
    assert_names(&err, "initial");
    assert!(BackoffConfigMirror::try_from(&micro).is_err());
    // A custom reason: registered in code.
    let mut gate = WriteGateConfig::default();
    gate.register(ReasonSpec::new("quota", UpdateRule::LatestWins))
        .unwrap();
    let err = serde_json::to_string(&gate).unwrap_err().to_string();
    assert_names(&err, "reasons");
}

/// Every JSON pointer into `value` (its own `""` included).
fn pointers(value: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                pointers(value, format!("{at}/{key}"), out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, value) in items.iter().enumerate() {
                pointers(value, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// No value in any place panics: every preset file with each of its values (objects and
/// arrays too) replaced by each of a set of odd values is read to a config or an error.
#[test]
fn no_value_in_any_place_panics() {
    let odd = [
        serde_json::json!(null),
        serde_json::json!(-1),
        serde_json::json!(0),
        serde_json::json!(u64::MAX),
        serde_json::json!(1.5),
        serde_json::json!("x"),
        serde_json::json!(true),
        serde_json::json!([]),
        serde_json::json!([0, 0, 0]),
        serde_json::json!({}),
        serde_json::json!({"none": null}),
    ];
    let mut read = 0;
    for preset in presets() {
        let value: serde_json::Value = serde_json::from_str(&(preset.json)()).unwrap();
        let mut at = Vec::new();
        pointers(&value, String::new(), &mut at);
        for pointer in &at {
            for odd in &odd {
                let mut edited = value.clone();
                *edited.pointer_mut(pointer).expect("a pointer of the value") = odd.clone();
                // Accepted or refused, never a panic; a refusal is a message.
                if let Err(e) = (preset.check_file)(&edited.to_string()) {
                    assert!(!e.is_empty());
                }
                read += 1;
            }
        }
    }
    assert!(read > 1_000, "{read} files read");
}

/// The README's `serde` example: a shipped preset file loads as its config, and a bad value is
/// refused with the field's name.
#[test]
fn a_config_file_loads_and_a_bad_value_is_refused_by_name() {
    let path = presets_dir().join("backoff.fluss_retriable_write.json");
    let text = std::fs::read_to_string(path).expect("the preset file");
    let cfg: BackoffConfig = serde_json::from_str(&text).expect("a preset file loads");
    assert_eq!(cfg, BackoffConfig::fluss_retriable_write());
    // One value of the wrong type: the error names the field.
    let bad = text.replace("\"initial_ms\": 100,", "\"initial_ms\": 1.5,");
    let err = serde_json::from_str::<BackoffConfig>(&bad).unwrap_err();
    assert!(err.to_string().contains("`initial_ms`"), "{err}");
}

#[test]
fn the_wake_slack_reads_back_defaults_when_absent_and_refuses_what_its_field_cannot_hold() {
    // A gate file written before the option existed reads as no slack.
    let old_gate = edited("write_gate.default", |m| {
        m.remove("wake_slack_ms")
            .expect("the preset writes the field");
    });
    let gate: WriteGateConfig = serde_json::from_str(&old_gate).unwrap();
    assert_eq!(gate.wake_slack(), Duration::ZERO);
    // A writer file without it takes the derived default (50 ms for the 1 s disk backoff).
    let writer: PacedWriterConfig = serde_json::from_str(&edited("paced_writer.default", |m| {
        assert!(
            m.get("wake_slack_ms").is_none(),
            "the default is not written"
        );
    }))
    .unwrap();
    assert_eq!(writer.explicit_wake_slack(), None);
    assert_eq!(writer.wake_slack(), Duration::from_millis(50));
    let set: PacedWriterConfig = serde_json::from_str(&edited("paced_writer.default", |m| {
        m.insert("wake_slack_ms".into(), 7.into());
    }))
    .unwrap();
    assert_eq!(set.wake_slack(), Duration::from_millis(7));
    // Past the 60 s ceiling: refused, naming the builder method.
    let e = refusal::<PacedWriterConfig>(&edited("paced_writer.default", |m| {
        m.insert("wake_slack_ms".into(), 60_001.into());
    }));
    assert!(e.contains("PacedWriterConfig::with_wake_slack"), "{e}");
    let e = refusal::<WriteGateConfig>(&edited("write_gate.default", |m| {
        m.insert("wake_slack_ms".into(), "5".into());
    }));
    assert_names(&e, "wake_slack_ms");
    // A slack that is not whole milliseconds cannot be written.
    let sub_ms = PacedWriterConfig::default().with_wake_slack(Duration::from_micros(1_500));
    let e = serde_json::to_string(&sub_ms).unwrap_err().to_string();
    assert!(e.contains("whole number of milliseconds"), "{e}");
}
