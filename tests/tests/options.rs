//! The option table: `docs/options.md` agrees with `throttle_sansio::options`, and every
//! refusal a config can produce names the builder method (and upstream key) of its option.

use core::time::Duration;

use throttle_sansio::ConfigError;
use throttle_sansio::backoff::{BackoffConfig, BackoffConfigBuilder, Jitter};
use throttle_sansio::backpressure::{
    PressureConfig, PressureConfigBuilder, ThrottleCurve, ThrottleCurveBuilder,
};
use throttle_sansio::batcher::BatcherConfig;
use throttle_sansio::conn_key::ConnConfig;
use throttle_sansio::dispatch_window::WindowConfig;
use throttle_sansio::failover::{
    AwsRetryQuotaConfig, CallConfig, CoalescerConfig, FinagleBudgetConfig, GrpcThrottleConfig,
};
use throttle_sansio::grpc_config::{GrpcRetryPolicy, GrpcRetryThrottling};
use throttle_sansio::limiter::{AimdConfig, Gradient2Config, LimiterConfig, SampleWindowConfig};
use throttle_sansio::options::{self, ConfigOption};
use throttle_sansio::paced_writer::PacedWriterConfig;
use throttle_sansio::pending_bytes::PendingBytesConfig;
use throttle_sansio::write_gate::{Reason, ReasonSpec, UpdateRule, WriteGateConfig};

const DOC: &str = include_str!("../../docs/options.md");
const BEGIN: &str = "<!-- options:begin -->";
const END: &str = "<!-- options:end -->";

/// The upstream column as the doc spells it.
fn upstream_cell(option: &ConfigOption) -> String {
    if option.upstream().is_empty() {
        return "none".to_string();
    }
    let keys: Vec<String> = option.upstream().iter().map(|u| u.to_string()).collect();
    keys.join(", ")
}

/// The table the code defines, one Markdown row per option of [`options::ALL`].
fn code_table() -> Vec<String> {
    let mut rows = vec![
        "| config | option | builder method | upstream |".to_string(),
        "|---|---|---|---|".to_string(),
    ];
    for option in options::ALL {
        rows.push(format!(
            "| `{}` | `{}` | `{}` | {} |",
            option.config(),
            option.name(),
            option.method(),
            upstream_cell(option)
        ));
    }
    rows
}

fn doc_table() -> Vec<String> {
    let start = DOC
        .find(BEGIN)
        .expect("docs/options.md has the begin marker")
        + BEGIN.len();
    let end = DOC.find(END).expect("docs/options.md has the end marker");
    DOC[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_doc_table_is_the_code_table() {
    let (doc, code) = (doc_table(), code_table());
    assert!(
        doc == code,
        "docs/options.md disagrees with throttle_sansio::options; the code's table is:\n{}",
        code.join("\n")
    );
}

#[test]
fn every_option_is_listed_once_and_names_a_method_of_its_config() {
    for (i, a) in options::ALL.iter().enumerate() {
        for b in &options::ALL[i + 1..] {
            assert!(
                (a.config(), a.name(), a.method()) != (b.config(), b.name(), b.method()),
                "{a:?} is listed twice"
            );
        }
        // `Type::method`, where `Type` is the config or its builder (`FooConfig` → `Foo…`).
        let (ty, method) = a.method().split_once("::").expect("a qualified method");
        assert!(!method.is_empty() && !method.contains("::"), "{a:?}");
        let config_type = a.config().split("::").next().unwrap_or_default();
        assert!(
            ty.starts_with(config_type) || config_type == "ReasonSpec" && ty == "ReasonSpec",
            "{a:?}: method of another type"
        );
    }
}

/// Every variant's message, for every option in the table, names the option, its builder
/// method and each upstream key (or says there is none).
#[test]
fn every_config_error_message_names_the_builder_method() {
    for &option in options::ALL {
        let errors = [
            ConfigError::OutOfRange {
                option,
                got: 0,
                min: 1,
                max: 2,
                unit: "ns",
            },
            ConfigError::Inverted {
                option,
                limit: &options::backoff::MAX,
            },
            ConfigError::Invalid {
                option,
                reason: "is wrong",
            },
        ];
        for e in errors {
            assert_message_names(&e, option);
        }
    }
}

fn assert_message_names(e: &ConfigError, option: &ConfigOption) {
    let msg = e.to_string();
    assert_eq!(e.option(), option);
    assert!(msg.contains(&format!("`{}`", option.name())), "{msg}");
    assert!(msg.contains(&format!("`{}`", option.method())), "{msg}");
    if option.upstream().is_empty() {
        assert!(msg.contains("no upstream key"), "{msg}");
    }
    for key in option.upstream() {
        assert!(
            msg.contains(&format!("{} `{}`", key.system(), key.key())),
            "{msg}"
        );
    }
}

/// Each refusal a real config produces, with the option it must report.
#[test]
fn every_refusal_reports_the_option_that_sets_the_bad_value() {
    let ms = Duration::from_millis;
    let disk = || BackoffConfig::fluss_disk_write_locked().to_builder();
    let grpc = || BackoffConfig::grpc_connection().to_builder();
    let gobblin = || BackoffConfig::gobblin_throttling_client().to_builder();
    let general = BackoffConfig::builder;
    let pressure = PressureConfig::builder;
    let mut gate = WriteGateConfig::default();
    let unknown = {
        let mut other = WriteGateConfig::default();
        other
            .register(ReasonSpec::new("x", UpdateRule::LatestWins))
            .expect("room for one")
    };
    let mut full = WriteGateConfig::default();
    let too_many = loop {
        match full.register(ReasonSpec::new("x", UpdateRule::LatestWins)) {
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    let cases: Vec<(Result<(), ConfigError>, &ConfigOption)> = vec![
        // Backoff: the general rules, then the preset keys.
        (
            general().resolution(Duration::ZERO).validate(),
            &options::backoff::RESOLUTION,
        ),
        (
            general().initial(ms(20_000)).validate(),
            &options::backoff::INITIAL,
        ),
        (
            general().multiplier(1, 0).validate(),
            &options::backoff::MULTIPLIER,
        ),
        (
            general().multiplier(1, 2).validate(),
            &options::backoff::MULTIPLIER,
        ),
        (
            general()
                .jitter(Jitter::Proportional { ppm: 1_000_001 })
                .validate(),
            &options::backoff::JITTER,
        ),
        (
            general().floor(ms(20_000)).validate(),
            &options::backoff::FLOOR,
        ),
        (
            general().floor(Duration::from_nanos(1)).validate(),
            &options::backoff::FLOOR,
        ),
        (
            disk().initial(Duration::from_nanos(1)).validate(),
            &options::backoff::FLUSS_DISK_INITIAL,
        ),
        (
            disk().max(Duration::MAX).validate(),
            &options::backoff::FLUSS_DISK_MAX,
        ),
        (
            BackoffConfig::fluss_retriable_write()
                .to_builder()
                .initial(ms(2_000))
                .validate(),
            &options::backoff::FLUSS_RETRY_INITIAL,
        ),
        (
            BackoffConfig::fluss_retriable_write()
                .to_builder()
                .max(Duration::MAX)
                .validate(),
            &options::backoff::FLUSS_RETRY_MAX,
        ),
        (
            BackoffConfig::kafka_retry()
                .to_builder()
                .initial(ms(2_000))
                .validate(),
            &options::backoff::KAFKA_INITIAL,
        ),
        (
            grpc().initial(ms(200_000)).validate(),
            &options::backoff::GRPC_INITIAL,
        ),
        (
            grpc().multiplier(1, 2).validate(),
            &options::backoff::GRPC_MULTIPLIER,
        ),
        (
            grpc()
                .jitter(Jitter::Proportional { ppm: 2_000_000 })
                .validate(),
            &options::backoff::GRPC_JITTER,
        ),
        (
            gobblin().initial(ms(20_000)).validate(),
            &options::backoff::GOBBLIN_INITIAL,
        ),
        (
            gobblin().multiplier(0, 1).validate(),
            &options::backoff::GOBBLIN_MULTIPLIER,
        ),
        // Backpressure, both halves.
        (
            pressure().l0_trigger(0).build().map(drop),
            &options::pressure::L0_TRIGGER,
        ),
        (
            pressure().l0_trigger(30).build().map(drop),
            &options::pressure::L0_TRIGGER,
        ),
        (
            pressure().l0_slowdown_writes_trigger(0).build().map(drop),
            &options::pressure::SLOWDOWN_TRIGGER,
        ),
        (
            pressure().flush_budget(0, 2).build().map(drop),
            &options::pressure::WRITE_BUFFER_SIZE,
        ),
        (
            pressure().flush_budget(1, 0).build().map(drop),
            &options::pressure::MAX_WRITE_BUFFERS,
        ),
        (
            pressure().flush_budget(1, 20).build().map(drop),
            &options::pressure::MAX_WRITE_BUFFERS,
        ),
        (
            ThrottleCurve::builder().exponent(0).build().map(drop),
            &options::curve::EXPONENT,
        ),
        (
            ThrottleCurve::builder()
                .max_throttle(Duration::MAX)
                .build()
                .map(drop),
            &options::curve::MAX_THROTTLE,
        ),
        (
            ThrottleCurve::builder()
                .max_throttle(Duration::from_micros(1_500))
                .build()
                .map(drop),
            &options::curve::MAX_THROTTLE,
        ),
        // The write gate's registry.
        (
            gate.register(ReasonSpec::new("p", UpdateRule::LatestWins).probe(Some(0)))
                .map(drop),
            &options::write_gate::PROBE_SENDS,
        ),
        (
            gate.set_probe(Reason::DISK_WRITE_LOCKED, Some(0)),
            &options::write_gate::SET_PROBE,
        ),
        (
            gate.set_probe(unknown, Some(1)),
            &options::write_gate::SET_PROBE,
        ),
        (
            gate.set_probe_ttl(unknown, ms(1)),
            &options::write_gate::SET_PROBE_TTL,
        ),
        (Err(too_many), &options::write_gate::REASONS),
        // The paced writer.
        (
            PacedWriterConfig::default().with_batch_bytes(0).validate(),
            &options::paced_writer::BATCH_BYTES,
        ),
        (
            PacedWriterConfig::default()
                .with_wake_slack(Duration::from_secs(61))
                .validate(),
            &options::paced_writer::WAKE_SLACK,
        ),
        (
            WriteGateConfig::default()
                .with_wake_slack(Duration::from_secs(61))
                .validate(),
            &options::write_gate::WAKE_SLACK,
        ),
        // Window, batcher, connections, failover.
        (
            WindowConfig::default().with_max_in_flight(0).validate(),
            &options::window::MAX_IN_FLIGHT,
        ),
        // The batcher's limits are `NonZero*` (no zero to refuse); only its window can be bad.
        (
            BatcherConfig::default()
                .with_window(WindowConfig::default().with_max_in_flight(0))
                .map(drop),
            &options::window::MAX_IN_FLIGHT,
        ),
        (
            ConnConfig::default()
                .with_max_idle(Duration::ZERO)
                .validate(),
            &options::conn::MAX_IDLE,
        ),
        (
            ConnConfig::default()
                .with_min_connect_timeout(Duration::ZERO)
                .validate(),
            &options::conn::MIN_CONNECT_TIMEOUT,
        ),
        (
            CoalescerConfig::default().with_max_waiters(0).validate(),
            &options::failover::MAX_WAITERS,
        ),
        (
            GrpcThrottleConfig::default().with_max_tokens(0).validate(),
            &options::failover::MAX_TOKENS,
        ),
        (
            GrpcThrottleConfig::default()
                .with_milli_token_ratio(0)
                .validate(),
            &options::failover::MILLI_TOKEN_RATIO,
        ),
        (
            FinagleBudgetConfig::default()
                .with_ttl(ms(1_500))
                .validate(),
            &options::failover::TTL,
        ),
        (
            FinagleBudgetConfig::default()
                .with_ttl(Duration::from_secs(61))
                .validate(),
            &options::failover::TTL,
        ),
        (
            FinagleBudgetConfig::default()
                .with_percent_can_retry_ppm(u32::MAX)
                .validate(),
            &options::failover::PERCENT_CAN_RETRY,
        ),
    ];
    for (i, (got, expected)) in cases.into_iter().enumerate() {
        let e = got.expect_err(&format!("case {i} ({}) is refused", expected.method()));
        assert_eq!(e.option(), expected, "case {i}: {e}");
        assert!(
            options::ALL.contains(&e.option()),
            "case {i}: {e} reports an option missing from options::ALL"
        );
        assert_message_names(&e, expected);
    }
}

/// `(option, Type::method)`: the method must exist (the compiler checks the path) and be the
/// one the table names.
macro_rules! methods {
    ($($option:expr => $ty:ident :: $method:ident),* $(,)?) => {
        [$({
            let _exists = $ty::$method;
            ($option, concat!(stringify!($ty), "::", stringify!($method)))
        }),*]
    };
}

/// Every method the table names is a real method of this crate, so a renamed builder method
/// fails to compile here until the table follows it.
#[test]
fn every_method_in_the_table_exists() {
    use options::*;
    let checked: &[(&ConfigOption, &str)] = &methods![
        &backoff::INITIAL => BackoffConfigBuilder::initial,
        &backoff::MAX => BackoffConfigBuilder::max,
        &backoff::MULTIPLIER => BackoffConfigBuilder::multiplier,
        &backoff::JITTER => BackoffConfigBuilder::jitter,
        &backoff::FLOOR => BackoffConfigBuilder::floor,
        &backoff::RESOLUTION => BackoffConfigBuilder::resolution,
        &backoff::TOTAL_BUDGET => BackoffConfigBuilder::total_budget,
        &backoff::MAX_ATTEMPTS => BackoffConfigBuilder::max_attempts,
        &backoff::MAX_WAIT => BackoffConfigBuilder::max_wait,
        &backoff::JITTER_ORDER => BackoffConfigBuilder::jitter_order,
        &backoff::FIRST_DELAY_UNJITTERED => BackoffConfigBuilder::first_delay_unjittered,
        &backoff::FLUSS_DISK_INITIAL => BackoffConfigBuilder::initial,
        &backoff::FLUSS_DISK_MAX => BackoffConfigBuilder::max,
        &backoff::FLUSS_RETRY_INITIAL => BackoffConfigBuilder::initial,
        &backoff::FLUSS_RETRY_MAX => BackoffConfigBuilder::max,
        &backoff::KAFKA_INITIAL => BackoffConfigBuilder::initial,
        &backoff::KAFKA_MAX => BackoffConfigBuilder::max,
        &backoff::GRPC_INITIAL => BackoffConfigBuilder::initial,
        &backoff::GRPC_MAX => BackoffConfigBuilder::max,
        &backoff::GRPC_MULTIPLIER => BackoffConfigBuilder::multiplier,
        &backoff::GRPC_JITTER => BackoffConfigBuilder::jitter,
        &backoff::GOBBLIN_INITIAL => BackoffConfigBuilder::initial,
        &backoff::GOBBLIN_MAX => BackoffConfigBuilder::max,
        &backoff::GOBBLIN_MULTIPLIER => BackoffConfigBuilder::multiplier,
        &grpc_service_config::JSON => GrpcRetryPolicy::from_json,
        &grpc_service_config::MAX_ATTEMPTS => GrpcRetryPolicy::from_json,
        &grpc_service_config::INITIAL_BACKOFF => GrpcRetryPolicy::from_json,
        &grpc_service_config::MAX_BACKOFF => GrpcRetryPolicy::from_json,
        &grpc_service_config::BACKOFF_MULTIPLIER => GrpcRetryPolicy::from_json,
        &grpc_service_config::RETRYABLE_STATUS_CODES => GrpcRetryPolicy::from_json,
        &grpc_service_config::THROTTLING_JSON => GrpcRetryThrottling::from_json,
        &grpc_service_config::MAX_TOKENS => GrpcRetryThrottling::from_json,
        &grpc_service_config::TOKEN_RATIO => GrpcRetryThrottling::from_json,
        &pressure::L0_TRIGGER => PressureConfigBuilder::l0_trigger,
        &pressure::SLOWDOWN_TRIGGER => PressureConfigBuilder::l0_slowdown_writes_trigger,
        &pressure::WRITE_BUFFER_SIZE => PressureConfigBuilder::flush_budget,
        &pressure::MAX_WRITE_BUFFERS => PressureConfigBuilder::flush_budget,
        &pressure::WITHOUT_FLUSH_BUDGET => PressureConfigBuilder::without_flush_budget,
        &curve::EXPONENT => ThrottleCurveBuilder::exponent,
        &curve::MAX_THROTTLE => ThrottleCurveBuilder::max_throttle,
        &write_gate::DISK_WRITE_LOCKED => WriteGateConfig::with_disk_write_locked,
        &write_gate::RETRIABLE_WRITE => WriteGateConfig::with_retriable_write,
        &write_gate::KV_CURVE => WriteGateConfig::with_kv_curve,
        &write_gate::REASONS => WriteGateConfig::register,
        &write_gate::PROBE_SENDS => ReasonSpec::probe,
        &write_gate::SET_PROBE => WriteGateConfig::set_probe,
        &write_gate::PROBE_TTL => ReasonSpec::probe_ttl,
        &write_gate::SET_PROBE_TTL => WriteGateConfig::set_probe_ttl,
        &write_gate::KV_JITTER => WriteGateConfig::with_kv_jitter,
        &write_gate::KV_HARD_REJECTION => WriteGateConfig::with_kv_hard_rejection_never_shorten,
        &write_gate::WAKE_SLACK => WriteGateConfig::with_wake_slack,
        &paced_writer::BATCH_BYTES => PacedWriterConfig::with_batch_bytes,
        &paced_writer::MAX_RETRIES => PacedWriterConfig::with_max_retries,
        &paced_writer::GATE => PacedWriterConfig::with_gate,
        &paced_writer::DISK_BACKOFF => PacedWriterConfig::with_disk_backoff,
        &paced_writer::KV_PRESSURE => PacedWriterConfig::with_kv_pressure,
        &paced_writer::WAKE_SLACK => PacedWriterConfig::with_wake_slack,
        &window::MAX_IN_FLIGHT => WindowConfig::with_max_in_flight,
        &limiter::AIMD_INITIAL => AimdConfig::with_limits,
        &limiter::AIMD_MIN => AimdConfig::with_limits,
        &limiter::AIMD_MAX => AimdConfig::with_limits,
        &limiter::AIMD_BACKOFF_RATIO => AimdConfig::with_backoff_ratio_ppm,
        &limiter::AIMD_TIMEOUT => AimdConfig::with_timeout,
        &limiter::GRADIENT2_INITIAL => Gradient2Config::with_limits,
        &limiter::GRADIENT2_MIN => Gradient2Config::with_limits,
        &limiter::GRADIENT2_MAX => Gradient2Config::with_limits,
        &limiter::GRADIENT2_SMOOTHING => Gradient2Config::with_smoothing_ppm,
        &limiter::GRADIENT2_QUEUE_SIZE => Gradient2Config::with_queue_size,
        &limiter::GRADIENT2_LONG_WINDOW => Gradient2Config::with_long_window,
        &limiter::GRADIENT2_RTT_TOLERANCE => Gradient2Config::with_rtt_tolerance_ppm,
        &limiter::ALGORITHM_AIMD => LimiterConfig::aimd,
        &limiter::ALGORITHM_GRADIENT2 => LimiterConfig::gradient2,
        &limiter::WINDOW => LimiterConfig::with_window,
        &limiter::WINDOW_MIN_TIME => SampleWindowConfig::with_window_time,
        &limiter::WINDOW_MAX_TIME => SampleWindowConfig::with_window_time,
        &limiter::WINDOW_SIZE => SampleWindowConfig::with_window_size,
        &limiter::WINDOW_MIN_RTT_THRESHOLD => SampleWindowConfig::with_min_rtt_threshold,
        &batcher::MAX_REQUESTS_PER_BATCH => BatcherConfig::with_max_requests_per_batch,
        &batcher::MAX_BATCH_BYTES => BatcherConfig::with_max_batch_bytes,
        &batcher::WINDOW => BatcherConfig::with_window,
        &batcher::OVERSIZED => BatcherConfig::with_oversized,
        &batcher::OP_TIMEOUT => BatcherConfig::with_op_timeout,
        &pending_bytes::MAX_PENDING_BYTES => PendingBytesConfig::with_max_pending_bytes,
        &conn::MAX_IDLE => ConnConfig::with_max_idle,
        &conn::CONNECT_BACKOFF => ConnConfig::with_connect_backoff,
        &conn::MIN_CONNECT_TIMEOUT => ConnConfig::with_min_connect_timeout,
        &conn::BACKOFF_FROM => ConnConfig::with_backoff_from,
        &failover::MAX_AUTO_RETRIES => CallConfig::with_max_auto_retries,
        &failover::CALL_BACKOFF => CallConfig::with_backoff,
        &failover::MAX_WAITERS => CoalescerConfig::with_max_waiters,
        &failover::MAX_TOKENS => GrpcThrottleConfig::with_max_tokens,
        &failover::MILLI_TOKEN_RATIO => GrpcThrottleConfig::with_milli_token_ratio,
        &failover::TTL => FinagleBudgetConfig::with_ttl,
        &failover::MIN_RETRIES_PER_SEC => FinagleBudgetConfig::with_min_retries_per_sec,
        &failover::PERCENT_CAN_RETRY => FinagleBudgetConfig::with_percent_can_retry_ppm,
        &failover::THROTTLING_BACKOFF => CallConfig::with_throttling_backoff,
        &failover::AWS_MAX_TOKENS => AwsRetryQuotaConfig::with_max_tokens,
        &failover::AWS_RETRY_COST => AwsRetryQuotaConfig::with_retry_cost,
        &failover::AWS_TIMEOUT_COST => AwsRetryQuotaConfig::with_timeout_cost,
        &failover::AWS_THROTTLING_COST => AwsRetryQuotaConfig::with_throttling_cost,
        &failover::AWS_NO_RETRY_INCREMENT => AwsRetryQuotaConfig::with_no_retry_increment,
    ];
    assert_eq!(
        checked.len(),
        ALL.len(),
        "every option of the table is checked here"
    );
    for ((option, path), listed) in checked.iter().zip(ALL) {
        assert_eq!(option, listed, "same order as options::ALL");
        assert_eq!(option.method(), *path, "{option:?}");
    }
}
