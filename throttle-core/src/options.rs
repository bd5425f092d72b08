//! Every configuration option of the crate in one table: its Rust name, the builder method that
//! sets it, and the upstream key it reproduces.
//!
//! A [`ConfigError`](crate::ConfigError) carries the [`ConfigOption`] at fault, so its message
//! names both the method to call and the key a user of the upstream client knows:
//!
//! ```
//! use throttle_sansio::WindowConfig;
//!
//! let err = WindowConfig::default().with_max_in_flight(0).validate().unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     format!(
//!         "`max_in_flight` = 0 batches is outside 1..={} batches \
//!          (`WindowConfig::with_max_in_flight`; Oxia `maxReadBatchesInFlight`, \
//!          Oxia `maxWriteBatchesInFlight`)",
//!         usize::MAX
//!     )
//! );
//! assert_eq!(err.option().method(), "WindowConfig::with_max_in_flight");
//! ```
//!
//! The constants are grouped by configuration, one module each; [`ALL`] lists every one of
//! them, in the order of `docs/options.md`, whose table a test checks against this one. The
//! [`name`](ConfigOption::name)s are the field names a serialised configuration will use.

use core::fmt;

/// A key of an upstream client or server whose behaviour an option reproduces.
///
/// ```
/// use throttle_sansio::options;
///
/// let [key] = options::curve::MAX_THROTTLE.upstream() else { panic!("one key") };
/// assert_eq!((key.system(), key.key()), ("Fluss", "client.writer.kv-backpressure.max-throttle"));
/// assert_eq!(key.to_string(), "Fluss `client.writer.kv-backpressure.max-throttle`");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Upstream {
    system: &'static str,
    key: &'static str,
}

impl Upstream {
    const fn new(system: &'static str, key: &'static str) -> Self {
        Upstream { system, key }
    }

    /// The project whose client or server has the key (`Fluss`, `Oxia`, `gRPC`, …).
    pub const fn system(&self) -> &'static str {
        self.system
    }

    /// The key as that project spells it (`client.writer.kv-backpressure.max-throttle`, …).
    pub const fn key(&self) -> &'static str {
        self.key
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.system, self.key)
    }
}

/// One configuration option: where it lives in Rust and which upstream key it reproduces.
///
/// `Display` shows the builder method and the upstream keys, e.g. ``
/// `WindowConfig::with_max_in_flight`; Oxia `maxReadBatchesInFlight`, Oxia
/// `maxWriteBatchesInFlight` ``, or `` `CoalescerConfig::with_max_waiters`; no upstream key ``.
///
/// ```
/// use throttle_sansio::options;
///
/// let option = &options::failover::MAX_WAITERS;
/// assert_eq!((option.config(), option.name()), ("CoalescerConfig", "max_waiters"));
/// assert!(option.upstream().is_empty());
/// assert_eq!(option.to_string(), "`CoalescerConfig::with_max_waiters`; no upstream key");
/// assert!(options::ALL.contains(&option));
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ConfigOption {
    config: &'static str,
    name: &'static str,
    method: &'static str,
    upstream: &'static [Upstream],
}

impl ConfigOption {
    const fn new(
        config: &'static str,
        name: &'static str,
        method: &'static str,
        upstream: &'static [Upstream],
    ) -> Self {
        ConfigOption {
            config,
            name,
            method,
            upstream,
        }
    }

    /// The configuration (or preset) the option belongs to, e.g. `WindowConfig` or
    /// `BackoffConfig::fluss_disk_write_locked()`.
    pub const fn config(&self) -> &'static str {
        self.config
    }

    /// The option's Rust name: the field (or argument) it sets, e.g. `max_in_flight`.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The method that sets it, with its type, e.g. `WindowConfig::with_max_in_flight`.
    pub const fn method(&self) -> &'static str {
        self.method
    }

    /// The upstream keys it reproduces; empty when no upstream client has one.
    pub const fn upstream(&self) -> &'static [Upstream] {
        self.upstream
    }
}

impl fmt::Display for ConfigOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`", self.method)?;
        if self.upstream.is_empty() {
            return f.write_str("; no upstream key");
        }
        for (i, key) in self.upstream.iter().enumerate() {
            f.write_str(if i == 0 { "; " } else { ", " })?;
            fmt::Display::fmt(key, f)?;
        }
        Ok(())
    }
}

/// A caller's own names for our options, so a [`ConfigError`](crate::ConfigError) names the
/// keys of the caller's configuration instead of our builder methods and upstream keys.
///
/// A client that reads its settings under its own names (the Fluss Rust writer's
/// `writer_batch_size`, `writer_retries`, …) lists which of our options each one sets, then
/// shows a refusal with [`ConfigError::display_with`](crate::ConfigError::display_with):
/// every option of the error that has an entry is named by the caller's key alone, one that
/// has none is named as [`ConfigError`](crate::ConfigError)'s own `Display` names it. The
/// numbers stay in the unit the message states (a backoff's bounds are in ns even where the
/// caller's key counts milliseconds).
///
/// An entry matches an option equal to it (`==`: the same configuration, name, method and
/// upstream keys, i.e. the same row of [`ALL`]), not the same address: the constants are
/// `const`, so two references to one may differ. Map the constant the configuration reports:
/// a preset's builder reports its own row (`backoff::FLUSS_RETRY_INITIAL` for
/// `BackoffConfig::fluss_retriable_write().to_builder()`), [`BackoffConfig::builder`]
/// the general one (`backoff::INITIAL`); map both if the caller's key may reach either. The
/// first matching entry wins. Looking up and displaying allocate nothing, and cannot panic.
///
/// [`BackoffConfig::builder`]: crate::BackoffConfig::builder
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::BackoffConfig;
/// use throttle_sansio::options::{self, OptionKeys};
///
/// // The Fluss Rust client's `Config` fields for the options it sets.
/// const FLUSS_KEYS: OptionKeys<'static> = OptionKeys::new(&[
///     (&options::backoff::FLUSS_RETRY_INITIAL, "writer_retry_backoff_ms"),
///     (&options::backoff::FLUSS_RETRY_MAX, "writer_retry_max_backoff_ms"),
///     (&options::paced_writer::BATCH_BYTES, "writer_batch_size"),
///     (&options::paced_writer::MAX_RETRIES, "writer_retries"),
/// ]);
///
/// let err = BackoffConfig::fluss_retriable_write()
///     .to_builder()
///     .initial(Duration::from_secs(5))
///     .build()
///     .unwrap_err();
/// assert_eq!(
///     err.display_with(FLUSS_KEYS).to_string(),
///     "`writer_retry_backoff_ms` must not exceed `writer_retry_max_backoff_ms`"
/// );
/// // Without the mapping, our names, methods and upstream keys:
/// assert!(err.to_string().starts_with("`initial` must not exceed `max` (`BackoffConfigBuilder::initial`"));
/// assert_eq!(FLUSS_KEYS.key(&options::paced_writer::BATCH_BYTES), Some("writer_batch_size"));
/// assert_eq!(FLUSS_KEYS.key(&options::backoff::INITIAL), None); // the general row: unmapped
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OptionKeys<'a> {
    entries: &'a [(&'a ConfigOption, &'a str)],
}

impl<'a> OptionKeys<'a> {
    /// No entries: every option is named as [`ConfigError`](crate::ConfigError)'s `Display`
    /// names it.
    pub const NONE: OptionKeys<'static> = OptionKeys { entries: &[] };

    /// The mapping of `entries`: each of our options, and the caller's key for it.
    pub const fn new(entries: &'a [(&'a ConfigOption, &'a str)]) -> Self {
        OptionKeys { entries }
    }

    /// The caller's key for `option`: that of the first entry equal to it, or `None`.
    pub fn key(&self, option: &ConfigOption) -> Option<&'a str> {
        self.entries
            .iter()
            .find(|(ours, _)| *ours == option)
            .map(|&(_, key)| key)
    }

    /// The entries, in the order given.
    pub const fn entries(&self) -> &'a [(&'a ConfigOption, &'a str)] {
        self.entries
    }
}

const NONE: &[Upstream] = &[];

/// [`BackoffConfig`](crate::BackoffConfig): the general rules, and the options each preset
/// maps to an upstream key. A preset's builder ([`to_builder`](crate::BackoffConfig::to_builder))
/// reports its own keys; options a preset does not map are reported as the general ones.
pub mod backoff {
    use super::{ConfigOption, NONE, Upstream};

    const B: &str = "BackoffConfig";

    /// The first base delay (general rules).
    pub const INITIAL: ConfigOption =
        ConfigOption::new(B, "initial", "BackoffConfigBuilder::initial", NONE);
    /// The largest delay, jitter included (general rules).
    pub const MAX: ConfigOption = ConfigOption::new(B, "max", "BackoffConfigBuilder::max", NONE);
    /// The growth factor `num/den`.
    pub const MULTIPLIER: ConfigOption =
        ConfigOption::new(B, "multiplier", "BackoffConfigBuilder::multiplier", NONE);
    /// The jitter strategy.
    pub const JITTER: ConfigOption =
        ConfigOption::new(B, "jitter", "BackoffConfigBuilder::jitter", NONE);
    /// The smallest delay.
    pub const FLOOR: ConfigOption =
        ConfigOption::new(B, "floor", "BackoffConfigBuilder::floor", NONE);
    /// The truncation step.
    pub const RESOLUTION: ConfigOption =
        ConfigOption::new(B, "resolution", "BackoffConfigBuilder::resolution", NONE);
    /// The hard total budget of one sequence (Gobblin's `maxWait` lets the crossing wait run,
    /// so it is not that key).
    pub const TOTAL_BUDGET: ConfigOption = ConfigOption::new(
        B,
        "total_budget",
        "BackoffConfigBuilder::total_budget",
        NONE,
    );
    /// Delays handed out at most (Gobblin's `maxRetries` check).
    pub const MAX_ATTEMPTS: ConfigOption = ConfigOption::new(
        B,
        "max_attempts",
        "BackoffConfigBuilder::max_attempts",
        &[Upstream::new("Gobblin", "ExponentialBackoff.maxRetries")],
    );
    /// The soft wait limit (Gobblin's `maxWait` check).
    pub const MAX_WAIT: ConfigOption = ConfigOption::new(
        B,
        "max_wait",
        "BackoffConfigBuilder::max_wait",
        &[Upstream::new("Gobblin", "ExponentialBackoff.maxWait")],
    );

    /// Whether `max` clamps the jittered delay or only the base.
    pub const JITTER_ORDER: ConfigOption = ConfigOption::new(
        B,
        "jitter_order",
        "BackoffConfigBuilder::jitter_order",
        NONE,
    );
    /// The first delay of a sequence is its base, undrawn (gRPC's first connection wait).
    pub const FIRST_DELAY_UNJITTERED: ConfigOption = ConfigOption::new(
        B,
        "first_delay_unjittered",
        "BackoffConfigBuilder::first_delay_unjittered",
        NONE,
    );

    const DISK: &str = "BackoffConfig::fluss_disk_write_locked()";
    /// `initial` of the Fluss disk-write-locked preset (Fluss PR #4293).
    pub const FLUSS_DISK_INITIAL: ConfigOption = ConfigOption::new(
        DISK,
        "initial",
        "BackoffConfigBuilder::initial",
        &[Upstream::new(
            "Fluss",
            "client.writer.disk-write-locked.backoff",
        )],
    );
    /// `max` of the Fluss disk-write-locked preset (Fluss PR #4293).
    pub const FLUSS_DISK_MAX: ConfigOption = ConfigOption::new(
        DISK,
        "max",
        "BackoffConfigBuilder::max",
        &[Upstream::new(
            "Fluss",
            "client.writer.disk-write-locked.backoff-max",
        )],
    );

    const RETRY: &str = "BackoffConfig::fluss_retriable_write()";
    /// `initial` of the Fluss retriable-write preset: the Fluss Rust client's
    /// `writer_retry_backoff_ms` (Fluss PR #4403, default 100), which mirrors the Kafka
    /// producer's `retry.backoff.ms` (the Java client has no such key).
    pub const FLUSS_RETRY_INITIAL: ConfigOption = ConfigOption::new(
        RETRY,
        "initial",
        "BackoffConfigBuilder::initial",
        &[
            Upstream::new("Fluss Rust", "writer_retry_backoff_ms"),
            Upstream::new("Kafka", "retry.backoff.ms"),
        ],
    );
    /// `max` of the Fluss retriable-write preset: the Fluss Rust client's
    /// `writer_retry_max_backoff_ms` (Fluss PR #4403, default 1000), which mirrors the Kafka
    /// producer's `retry.backoff.max.ms`.
    pub const FLUSS_RETRY_MAX: ConfigOption = ConfigOption::new(
        RETRY,
        "max",
        "BackoffConfigBuilder::max",
        &[
            Upstream::new("Fluss Rust", "writer_retry_max_backoff_ms"),
            Upstream::new("Kafka", "retry.backoff.max.ms"),
        ],
    );

    const KAFKA: &str = "BackoffConfig::kafka_retry()";
    /// `initial` of the Kafka preset.
    pub const KAFKA_INITIAL: ConfigOption = ConfigOption::new(
        KAFKA,
        "initial",
        "BackoffConfigBuilder::initial",
        &[Upstream::new("Kafka", "retry.backoff.ms")],
    );
    /// `max` of the Kafka preset.
    pub const KAFKA_MAX: ConfigOption = ConfigOption::new(
        KAFKA,
        "max",
        "BackoffConfigBuilder::max",
        &[Upstream::new("Kafka", "retry.backoff.max.ms")],
    );

    const GRPC: &str = "BackoffConfig::grpc_connection()";
    /// `initial` of the gRPC connection-backoff preset.
    pub const GRPC_INITIAL: ConfigOption = ConfigOption::new(
        GRPC,
        "initial",
        "BackoffConfigBuilder::initial",
        &[Upstream::new("gRPC", "INITIAL_BACKOFF")],
    );
    /// `max` of the gRPC connection-backoff preset.
    pub const GRPC_MAX: ConfigOption = ConfigOption::new(
        GRPC,
        "max",
        "BackoffConfigBuilder::max",
        &[Upstream::new("gRPC", "MAX_BACKOFF")],
    );
    /// `multiplier` of the gRPC connection-backoff preset.
    pub const GRPC_MULTIPLIER: ConfigOption = ConfigOption::new(
        GRPC,
        "multiplier",
        "BackoffConfigBuilder::multiplier",
        &[Upstream::new("gRPC", "MULTIPLIER")],
    );
    /// `jitter` of the gRPC connection-backoff preset.
    pub const GRPC_JITTER: ConfigOption = ConfigOption::new(
        GRPC,
        "jitter",
        "BackoffConfigBuilder::jitter",
        &[Upstream::new("gRPC", "JITTER")],
    );

    const GOBBLIN: &str = "BackoffConfig::gobblin_throttling_client()";
    /// `initial` of the Gobblin preset.
    pub const GOBBLIN_INITIAL: ConfigOption = ConfigOption::new(
        GOBBLIN,
        "initial",
        "BackoffConfigBuilder::initial",
        &[Upstream::new("Gobblin", "ExponentialBackoff.initialDelay")],
    );
    /// `max` of the Gobblin preset.
    pub const GOBBLIN_MAX: ConfigOption = ConfigOption::new(
        GOBBLIN,
        "max",
        "BackoffConfigBuilder::max",
        &[Upstream::new("Gobblin", "ExponentialBackoff.maxDelay")],
    );
    /// `multiplier` of the Gobblin preset.
    pub const GOBBLIN_MULTIPLIER: ConfigOption = ConfigOption::new(
        GOBBLIN,
        "multiplier",
        "BackoffConfigBuilder::multiplier",
        &[Upstream::new("Gobblin", "ExponentialBackoff.alpha")],
    );
}

/// The gRPC service-config keys [`crate::grpc_config`] reads (gRFC A6), named as in the JSON.
pub mod grpc_service_config {
    use super::{ConfigOption, NONE, Upstream};

    const P: &str = "GrpcRetryPolicy";
    const RP: &str = "GrpcRetryPolicy::from_json";
    const T: &str = "GrpcRetryThrottling";
    const RT: &str = "GrpcRetryThrottling::from_json";

    /// A retry policy's or method config's JSON text itself (malformed, or nested too deeply).
    pub const JSON: ConfigOption = ConfigOption::new(P, "json", RP, NONE);
    /// A `retryThrottling` object's JSON text itself.
    pub const THROTTLING_JSON: ConfigOption = ConfigOption::new(T, "json", RT, NONE);
    /// Attempts including the original (2..=5 after A6's cap).
    pub const MAX_ATTEMPTS: ConfigOption = ConfigOption::new(
        P,
        "maxAttempts",
        RP,
        &[Upstream::new("gRPC", "retryPolicy.maxAttempts")],
    );
    /// The first backoff, a proto-JSON duration.
    pub const INITIAL_BACKOFF: ConfigOption = ConfigOption::new(
        P,
        "initialBackoff",
        RP,
        &[Upstream::new("gRPC", "retryPolicy.initialBackoff")],
    );
    /// The largest base backoff, a proto-JSON duration.
    pub const MAX_BACKOFF: ConfigOption = ConfigOption::new(
        P,
        "maxBackoff",
        RP,
        &[Upstream::new("gRPC", "retryPolicy.maxBackoff")],
    );
    /// The growth factor, at least 1 here.
    pub const BACKOFF_MULTIPLIER: ConfigOption = ConfigOption::new(
        P,
        "backoffMultiplier",
        RP,
        &[Upstream::new("gRPC", "retryPolicy.backoffMultiplier")],
    );
    /// The status codes that are retried.
    pub const RETRYABLE_STATUS_CODES: ConfigOption = ConfigOption::new(
        P,
        "retryableStatusCodes",
        RP,
        &[Upstream::new("gRPC", "retryPolicy.retryableStatusCodes")],
    );
    /// The throttle's token count, 1..=1000.
    pub const MAX_TOKENS: ConfigOption = ConfigOption::new(
        T,
        "maxTokens",
        RT,
        &[Upstream::new("gRPC", "retryThrottling.maxTokens")],
    );
    /// Tokens a success adds, kept to three decimals.
    pub const TOKEN_RATIO: ConfigOption = ConfigOption::new(
        T,
        "tokenRatio",
        RT,
        &[Upstream::new("gRPC", "retryThrottling.tokenRatio")],
    );
}

/// [`PressureConfig`](crate::PressureConfig), the server half of KV backpressure.
pub mod pressure {
    use super::{ConfigOption, NONE, Upstream};

    const P: &str = "PressureConfig";

    /// `Tf`: the L0 file count at which pressure starts.
    pub const L0_TRIGGER: ConfigOption = ConfigOption::new(
        P,
        "l0_trigger",
        "PressureConfigBuilder::l0_trigger",
        &[Upstream::new(
            "Fluss",
            "kv.backpressure.l0-slowdown-trigger",
        )],
    );
    /// `Tr`: the L0 file count at which writes are rejected.
    pub const SLOWDOWN_TRIGGER: ConfigOption = ConfigOption::new(
        P,
        "l0_slowdown_writes_trigger",
        "PressureConfigBuilder::l0_slowdown_writes_trigger",
        &[Upstream::new("RocksDB", "level0_slowdown_writes_trigger")],
    );
    /// The flush budget's bytes per memtable.
    pub const WRITE_BUFFER_SIZE: ConfigOption = ConfigOption::new(
        P,
        "write_buffer_size",
        "PressureConfigBuilder::flush_budget",
        &[
            Upstream::new("Fluss", "kv.rocksdb.writebuffer.size"),
            Upstream::new("RocksDB", "write_buffer_size"),
        ],
    );
    /// The flush budget's memtables counted as headroom.
    pub const MAX_WRITE_BUFFERS: ConfigOption = ConfigOption::new(
        P,
        "max_write_buffers",
        "PressureConfigBuilder::flush_budget",
        &[
            Upstream::new("Fluss", "kv.rocksdb.writebuffer.count"),
            Upstream::new("RocksDB", "max_write_buffer_number"),
        ],
    );
    /// Turning the flush budget off (never refused; listed for completeness).
    pub const WITHOUT_FLUSH_BUDGET: ConfigOption = ConfigOption::new(
        P,
        "flush_budget",
        "PressureConfigBuilder::without_flush_budget",
        NONE,
    );
}

/// [`ThrottleCurve`](crate::ThrottleCurve), the client half of KV backpressure.
pub mod curve {
    use super::{ConfigOption, NONE, Upstream};

    const C: &str = "ThrottleCurve";

    /// The exponent `k` (Fluss fixes it: 2 as landed, 3 in issue #3454).
    pub const EXPONENT: ConfigOption =
        ConfigOption::new(C, "exponent", "ThrottleCurveBuilder::exponent", NONE);
    /// The ceiling, the delay of a full signal.
    pub const MAX_THROTTLE: ConfigOption = ConfigOption::new(
        C,
        "max_throttle",
        "ThrottleCurveBuilder::max_throttle",
        &[Upstream::new(
            "Fluss",
            "client.writer.kv-backpressure.max-throttle",
        )],
    );
}

/// [`WriteGateConfig`](crate::WriteGateConfig) and its reason registry.
pub mod write_gate {
    use super::{ConfigOption, NONE};

    const G: &str = "WriteGateConfig";

    /// The backoff of `DISK_WRITE_LOCKED` rejections (a [`BackoffConfig`](crate::BackoffConfig),
    /// whose own options carry the upstream keys).
    pub const DISK_WRITE_LOCKED: ConfigOption = ConfigOption::new(
        G,
        "disk_write_locked",
        "WriteGateConfig::with_disk_write_locked",
        NONE,
    );
    /// The backoff of other retriable write errors.
    pub const RETRIABLE_WRITE: ConfigOption = ConfigOption::new(
        G,
        "retriable_write",
        "WriteGateConfig::with_retriable_write",
        NONE,
    );
    /// The pressure-to-delay curve (a [`ThrottleCurve`](crate::ThrottleCurve)).
    pub const KV_CURVE: ConfigOption =
        ConfigOption::new(G, "kv_curve", "WriteGateConfig::with_kv_curve", NONE);
    /// The custom reasons (at most [`MAX_REASONS`](crate::write_gate::MAX_REASONS) in all).
    pub const REASONS: ConfigOption =
        ConfigOption::new(G, "reasons", "WriteGateConfig::register", NONE);
    /// A reason's probe allowance, given at registration (suggested in review of Fluss PR
    /// #4293, no upstream key).
    pub const PROBE_SENDS: ConfigOption =
        ConfigOption::new("ReasonSpec", "probe_sends", "ReasonSpec::probe", NONE);
    /// A registered reason's probe allowance.
    pub const SET_PROBE: ConfigOption =
        ConfigOption::new(G, "probe_sends", "WriteGateConfig::set_probe", NONE);
    /// A reason's probe time to live, given at registration.
    pub const PROBE_TTL: ConfigOption =
        ConfigOption::new("ReasonSpec", "probe_ttl", "ReasonSpec::probe_ttl", NONE);
    /// A registered reason's probe time to live.
    pub const SET_PROBE_TTL: ConfigOption =
        ConfigOption::new(G, "probe_ttl", "WriteGateConfig::set_probe_ttl", NONE);
    /// Jitter on KV throttles, ± ppm of the curve's delay (no upstream key: Fluss has none).
    pub const KV_JITTER: ConfigOption =
        ConfigOption::new(G, "kv_jitter_ppm", "WriteGateConfig::with_kv_jitter", NONE);
    /// Wake coalescing: the timer slack added to the earliest opening (no upstream key: Fluss
    /// wakes at the earliest deadline).
    pub const WAKE_SLACK: ConfigOption =
        ConfigOption::new(G, "wake_slack", "WriteGateConfig::with_wake_slack", NONE);
    /// The never-shorten rule for KV hard rejections (no upstream key: Fluss's clients let
    /// the latest KV response win).
    pub const KV_HARD_REJECTION: ConfigOption = ConfigOption::new(
        G,
        "kv_hard_rejection",
        "WriteGateConfig::with_kv_hard_rejection_never_shorten",
        NONE,
    );
}

/// [`PacedWriterConfig`](crate::PacedWriterConfig).
pub mod paced_writer {
    use super::{ConfigOption, NONE, Upstream};

    const P: &str = "PacedWriterConfig";

    /// Bytes per batch at most (a larger record travels alone).
    pub const BATCH_BYTES: ConfigOption = ConfigOption::new(
        P,
        "batch_bytes",
        "PacedWriterConfig::with_batch_bytes",
        &[Upstream::new("Fluss", "client.writer.batch-size")],
    );
    /// Retries of a rejected batch before it fails.
    pub const MAX_RETRIES: ConfigOption = ConfigOption::new(
        P,
        "max_retries",
        "PacedWriterConfig::with_max_retries",
        &[Upstream::new("Fluss", "client.writer.retries")],
    );
    /// The write gate (a [`WriteGateConfig`](crate::WriteGateConfig)).
    pub const GATE: ConfigOption =
        ConfigOption::new(P, "gate", "PacedWriterConfig::with_gate", NONE);
    /// Whether disk rejections back off.
    pub const DISK_BACKOFF: ConfigOption = ConfigOption::new(
        P,
        "disk_backoff",
        "PacedWriterConfig::with_disk_backoff",
        NONE,
    );
    /// Whether piggybacked KV pressure is fed to the gate.
    pub const KV_PRESSURE: ConfigOption = ConfigOption::new(
        P,
        "kv_pressure",
        "PacedWriterConfig::with_kv_pressure",
        NONE,
    );
    /// The writer's wake slack (replaces its gate's own; default derived from the disk
    /// backoff).
    pub const WAKE_SLACK: ConfigOption =
        ConfigOption::new(P, "wake_slack", "PacedWriterConfig::with_wake_slack", NONE);
}

/// [`WindowConfig`](crate::WindowConfig).
pub mod window {
    use super::{ConfigOption, Upstream};

    /// Batches allowed outstanding per shard.
    pub const MAX_IN_FLIGHT: ConfigOption = ConfigOption::new(
        "WindowConfig",
        "max_in_flight",
        "WindowConfig::with_max_in_flight",
        &[
            Upstream::new("Oxia", "maxReadBatchesInFlight"),
            Upstream::new("Oxia", "maxWriteBatchesInFlight"),
        ],
    );
}

/// [`AimdConfig`](crate::limiter::AimdConfig), [`Gradient2Config`](crate::limiter::Gradient2Config)
/// and [`SampleWindowConfig`](crate::limiter::SampleWindowConfig): the adaptive limiter.
pub mod limiter {
    use super::{ConfigOption, Upstream};

    const NETFLIX: &str = "Netflix concurrency-limits";
    const A: &str = "AimdConfig";
    const G: &str = "Gradient2Config";
    const W: &str = "SampleWindowConfig";

    /// AIMD: the limit before the first sample.
    pub const AIMD_INITIAL: ConfigOption = ConfigOption::new(
        A,
        "initial",
        "AimdConfig::with_limits",
        &[Upstream::new(NETFLIX, "AIMDLimit.initialLimit")],
    );
    /// AIMD: the smallest limit.
    pub const AIMD_MIN: ConfigOption = ConfigOption::new(
        A,
        "min",
        "AimdConfig::with_limits",
        &[Upstream::new(NETFLIX, "AIMDLimit.minLimit")],
    );
    /// AIMD: the largest limit.
    pub const AIMD_MAX: ConfigOption = ConfigOption::new(
        A,
        "max",
        "AimdConfig::with_limits",
        &[Upstream::new(NETFLIX, "AIMDLimit.maxLimit")],
    );
    /// AIMD: the factor a drop multiplies the limit by, in ppm.
    pub const AIMD_BACKOFF_RATIO: ConfigOption = ConfigOption::new(
        A,
        "backoff_ratio_ppm",
        "AimdConfig::with_backoff_ratio_ppm",
        &[Upstream::new(NETFLIX, "AIMDLimit.backoffRatio")],
    );
    /// AIMD: a round trip longer than this counts as a drop.
    pub const AIMD_TIMEOUT: ConfigOption = ConfigOption::new(
        A,
        "timeout",
        "AimdConfig::with_timeout",
        &[Upstream::new(NETFLIX, "AIMDLimit.timeout")],
    );
    /// Gradient2: the limit before the first sample.
    pub const GRADIENT2_INITIAL: ConfigOption = ConfigOption::new(
        G,
        "initial",
        "Gradient2Config::with_limits",
        &[Upstream::new(NETFLIX, "Gradient2Limit.initialLimit")],
    );
    /// Gradient2: the smallest limit.
    pub const GRADIENT2_MIN: ConfigOption = ConfigOption::new(
        G,
        "min",
        "Gradient2Config::with_limits",
        &[Upstream::new(NETFLIX, "Gradient2Limit.minLimit")],
    );
    /// Gradient2: the largest limit.
    pub const GRADIENT2_MAX: ConfigOption = ConfigOption::new(
        G,
        "max",
        "Gradient2Config::with_limits",
        &[Upstream::new(NETFLIX, "Gradient2Limit.maxConcurrency")],
    );
    /// Gradient2: the share of a new estimate taken into the limit per update, in ppm.
    pub const GRADIENT2_SMOOTHING: ConfigOption = ConfigOption::new(
        G,
        "smoothing_ppm",
        "Gradient2Config::with_smoothing_ppm",
        &[Upstream::new(NETFLIX, "Gradient2Limit.smoothing")],
    );
    /// Gradient2: the growth allowed while latency stays low (requests of queueing).
    pub const GRADIENT2_QUEUE_SIZE: ConfigOption = ConfigOption::new(
        G,
        "queue_size",
        "Gradient2Config::with_queue_size",
        &[Upstream::new(NETFLIX, "Gradient2Limit.queueSize")],
    );
    /// Gradient2: the samples the long-term round trip averages over.
    pub const GRADIENT2_LONG_WINDOW: ConfigOption = ConfigOption::new(
        G,
        "long_window",
        "Gradient2Config::with_long_window",
        &[Upstream::new(NETFLIX, "Gradient2Limit.longWindow")],
    );
    /// Gradient2: the rise of the round trip over its long-term average tolerated, in ppm.
    pub const GRADIENT2_RTT_TOLERANCE: ConfigOption = ConfigOption::new(
        G,
        "rtt_tolerance_ppm",
        "Gradient2Config::with_rtt_tolerance_ppm",
        &[Upstream::new(NETFLIX, "Gradient2Limit.rttTolerance")],
    );
    /// The limiter's algorithm: `aimd` or `gradient2` (a file gives exactly one).
    pub const ALGORITHM_AIMD: ConfigOption =
        ConfigOption::new("LimiterConfig", "aimd", "LimiterConfig::aimd", &[]);
    /// The limiter's algorithm, the other choice.
    pub const ALGORITHM_GRADIENT2: ConfigOption = ConfigOption::new(
        "LimiterConfig",
        "gradient2",
        "LimiterConfig::gradient2",
        &[],
    );
    /// The limiter's optional sample window.
    pub const WINDOW: ConfigOption = ConfigOption::new(
        "LimiterConfig",
        "window",
        "LimiterConfig::with_window",
        &[Upstream::new(NETFLIX, "WindowedLimit")],
    );
    /// Sample window: the shortest window.
    pub const WINDOW_MIN_TIME: ConfigOption = ConfigOption::new(
        W,
        "min_window",
        "SampleWindowConfig::with_window_time",
        &[Upstream::new(NETFLIX, "WindowedLimit.minWindowTime")],
    );
    /// Sample window: the longest window.
    pub const WINDOW_MAX_TIME: ConfigOption = ConfigOption::new(
        W,
        "max_window",
        "SampleWindowConfig::with_window_time",
        &[Upstream::new(NETFLIX, "WindowedLimit.maxWindowTime")],
    );
    /// Sample window: the samples a window needs before it updates the limit.
    pub const WINDOW_SIZE: ConfigOption = ConfigOption::new(
        W,
        "window_size",
        "SampleWindowConfig::with_window_size",
        &[Upstream::new(NETFLIX, "WindowedLimit.windowSize")],
    );
    /// Sample window: round trips below this are ignored.
    pub const WINDOW_MIN_RTT_THRESHOLD: ConfigOption = ConfigOption::new(
        W,
        "min_rtt_threshold",
        "SampleWindowConfig::with_min_rtt_threshold",
        &[Upstream::new(NETFLIX, "WindowedLimit.minRttThreshold")],
    );
}

/// [`BatcherConfig`](crate::BatcherConfig).
pub mod batcher {
    use super::{ConfigOption, NONE, Upstream};

    const B: &str = "BatcherConfig";

    /// Operations per batch at most.
    pub const MAX_REQUESTS_PER_BATCH: ConfigOption = ConfigOption::new(
        B,
        "max_requests_per_batch",
        "BatcherConfig::with_max_requests_per_batch",
        &[Upstream::new("Oxia", "maxRequestsPerBatch")],
    );
    /// Bytes per write batch at most.
    pub const MAX_BATCH_BYTES: ConfigOption = ConfigOption::new(
        B,
        "max_batch_bytes",
        "BatcherConfig::with_max_batch_bytes",
        &[Upstream::new("Oxia", "maxBatchSize")],
    );
    /// The per-shard dispatch window (a [`WindowConfig`](crate::WindowConfig)).
    pub const WINDOW: ConfigOption =
        ConfigOption::new(B, "window", "BatcherConfig::with_window", NONE);
    /// What a write batcher does with an operation larger than the batch limit (Oxia refuses
    /// it with `RequestTooLarge`).
    pub const OVERSIZED: ConfigOption =
        ConfigOption::new(B, "oversized", "BatcherConfig::with_oversized", NONE);
    /// Each operation's timeout, from its acceptance.
    pub const OP_TIMEOUT: ConfigOption = ConfigOption::new(
        B,
        "op_timeout",
        "BatcherConfig::with_op_timeout",
        &[Upstream::new("Oxia", "requestTimeout")],
    );
}

/// [`PendingBytesConfig`](crate::PendingBytesConfig).
pub mod pending_bytes {
    use super::{ConfigOption, Upstream};

    /// The bound in bytes (0 disables the limiter).
    pub const MAX_PENDING_BYTES: ConfigOption = ConfigOption::new(
        "PendingBytesConfig",
        "max_pending_bytes",
        "PendingBytesConfig::with_max_pending_bytes",
        &[Upstream::new("Oxia", "maxPendingBytes")],
    );
}

/// [`ConnConfig`](crate::ConnConfig).
pub mod conn {
    use super::{ConfigOption, NONE, Upstream};

    /// How long a connection with nothing in flight stays open.
    pub const MAX_IDLE: ConfigOption = ConfigOption::new(
        "ConnConfig",
        "max_idle",
        "ConnConfig::with_max_idle",
        &[Upstream::new("Fluss", "netty.connection.max-idle-time")],
    );
    /// The backoff between failed connects (a [`BackoffConfig`](crate::BackoffConfig)).
    pub const CONNECT_BACKOFF: ConfigOption = ConfigOption::new(
        "ConnConfig",
        "connect_backoff",
        "ConnConfig::with_connect_backoff",
        NONE,
    );
    /// The least time a connect attempt is given.
    pub const MIN_CONNECT_TIMEOUT: ConfigOption = ConfigOption::new(
        "ConnConfig",
        "min_connect_timeout",
        "ConnConfig::with_min_connect_timeout",
        &[Upstream::new("gRPC", "MIN_CONNECT_TIMEOUT")],
    );
    /// From when a failed connect's backoff counts (a [`BackoffFrom`](crate::conn_key::BackoffFrom)).
    pub const BACKOFF_FROM: ConfigOption = ConfigOption::new(
        "ConnConfig",
        "backoff_from",
        "ConnConfig::with_backoff_from",
        NONE,
    );
}

/// The failover configurations: [`CallConfig`](crate::CallConfig), the coalescer and the
/// retry budgets.
pub mod failover {
    use super::{ConfigOption, NONE, Upstream};

    /// Automatic retries per call (Fluss's proxy retries once, without a key).
    pub const MAX_AUTO_RETRIES: ConfigOption = ConfigOption::new(
        "CallConfig",
        "max_auto_retries",
        "CallConfig::with_max_auto_retries",
        NONE,
    );
    /// The backoff before each automatic retry.
    pub const CALL_BACKOFF: ConfigOption =
        ConfigOption::new("CallConfig", "backoff", "CallConfig::with_backoff", NONE);
    /// Calls held by the refresh coalescer at once.
    pub const MAX_WAITERS: ConfigOption = ConfigOption::new(
        "CoalescerConfig",
        "max_waiters",
        "CoalescerConfig::with_max_waiters",
        NONE,
    );
    /// gRPC retry throttling's token count.
    pub const MAX_TOKENS: ConfigOption = ConfigOption::new(
        "GrpcThrottleConfig",
        "max_tokens",
        "GrpcThrottleConfig::with_max_tokens",
        &[Upstream::new("gRPC", "retryThrottling.maxTokens")],
    );
    /// gRPC retry throttling's refill per success, in milli-tokens.
    pub const MILLI_TOKEN_RATIO: ConfigOption = ConfigOption::new(
        "GrpcThrottleConfig",
        "milli_token_ratio",
        "GrpcThrottleConfig::with_milli_token_ratio",
        &[Upstream::new("gRPC", "retryThrottling.tokenRatio")],
    );
    /// How long a Finagle budget's deposits and withdrawals count.
    pub const TTL: ConfigOption = ConfigOption::new(
        "FinagleBudgetConfig",
        "ttl",
        "FinagleBudgetConfig::with_ttl",
        &[
            Upstream::new("Finagle", "RetryBudget.ttl"),
            Upstream::new("tower", "TpsBudget::new(ttl)"),
        ],
    );
    /// A Finagle budget's reserve rate.
    pub const MIN_RETRIES_PER_SEC: ConfigOption = ConfigOption::new(
        "FinagleBudgetConfig",
        "min_retries_per_sec",
        "FinagleBudgetConfig::with_min_retries_per_sec",
        &[
            Upstream::new("Finagle", "RetryBudget.minRetriesPerSec"),
            Upstream::new("tower", "TpsBudget::new(min_per_sec)"),
        ],
    );
    /// A Finagle budget's retries per request, in ppm.
    pub const PERCENT_CAN_RETRY: ConfigOption = ConfigOption::new(
        "FinagleBudgetConfig",
        "percent_can_retry_ppm",
        "FinagleBudgetConfig::with_percent_can_retry_ppm",
        &[
            Upstream::new("Finagle", "RetryBudget.percentCanRetry"),
            Upstream::new("tower", "TpsBudget::new(retry_percent)"),
        ],
    );
    /// The backoff before retries after throttling errors.
    pub const THROTTLING_BACKOFF: ConfigOption = ConfigOption::new(
        "CallConfig",
        "throttling_backoff",
        "CallConfig::with_throttling_backoff",
        NONE,
    );
    /// The AWS retry quota's bucket size.
    pub const AWS_MAX_TOKENS: ConfigOption = ConfigOption::new(
        "AwsRetryQuotaConfig",
        "max_tokens",
        "AwsRetryQuotaConfig::with_max_tokens",
        &[Upstream::new(
            "aws-sdk-js-v3",
            "getDefaultRetryQuota(initialRetryTokens)",
        )],
    );
    /// What a retry after a transient error costs the AWS retry quota.
    pub const AWS_RETRY_COST: ConfigOption = ConfigOption::new(
        "AwsRetryQuotaConfig",
        "retry_cost",
        "AwsRetryQuotaConfig::with_retry_cost",
        &[Upstream::new(
            "aws-sdk-js-v3",
            "DefaultRetryQuotaOptions.retryCost",
        )],
    );
    /// What a retry after a timeout costs the AWS retry quota.
    pub const AWS_TIMEOUT_COST: ConfigOption = ConfigOption::new(
        "AwsRetryQuotaConfig",
        "timeout_cost",
        "AwsRetryQuotaConfig::with_timeout_cost",
        &[Upstream::new(
            "aws-sdk-js-v3",
            "DefaultRetryQuotaOptions.timeoutRetryCost",
        )],
    );
    /// What a retry after a throttling error costs the AWS retry quota.
    pub const AWS_THROTTLING_COST: ConfigOption = ConfigOption::new(
        "AwsRetryQuotaConfig",
        "throttling_cost",
        "AwsRetryQuotaConfig::with_throttling_cost",
        NONE,
    );
    /// What a success at the first attempt adds to the AWS retry quota.
    pub const AWS_NO_RETRY_INCREMENT: ConfigOption = ConfigOption::new(
        "AwsRetryQuotaConfig",
        "no_retry_increment",
        "AwsRetryQuotaConfig::with_no_retry_increment",
        &[Upstream::new(
            "aws-sdk-js-v3",
            "DefaultRetryQuotaOptions.noRetryIncrement",
        )],
    );
}

/// Every option above, in the order of the table in `docs/options.md`.
pub const ALL: &[&ConfigOption] = &[
    &backoff::INITIAL,
    &backoff::MAX,
    &backoff::MULTIPLIER,
    &backoff::JITTER,
    &backoff::FLOOR,
    &backoff::RESOLUTION,
    &backoff::TOTAL_BUDGET,
    &backoff::MAX_ATTEMPTS,
    &backoff::MAX_WAIT,
    &backoff::JITTER_ORDER,
    &backoff::FIRST_DELAY_UNJITTERED,
    &backoff::FLUSS_DISK_INITIAL,
    &backoff::FLUSS_DISK_MAX,
    &backoff::FLUSS_RETRY_INITIAL,
    &backoff::FLUSS_RETRY_MAX,
    &backoff::KAFKA_INITIAL,
    &backoff::KAFKA_MAX,
    &backoff::GRPC_INITIAL,
    &backoff::GRPC_MAX,
    &backoff::GRPC_MULTIPLIER,
    &backoff::GRPC_JITTER,
    &backoff::GOBBLIN_INITIAL,
    &backoff::GOBBLIN_MAX,
    &backoff::GOBBLIN_MULTIPLIER,
    &grpc_service_config::JSON,
    &grpc_service_config::MAX_ATTEMPTS,
    &grpc_service_config::INITIAL_BACKOFF,
    &grpc_service_config::MAX_BACKOFF,
    &grpc_service_config::BACKOFF_MULTIPLIER,
    &grpc_service_config::RETRYABLE_STATUS_CODES,
    &grpc_service_config::THROTTLING_JSON,
    &grpc_service_config::MAX_TOKENS,
    &grpc_service_config::TOKEN_RATIO,
    &pressure::L0_TRIGGER,
    &pressure::SLOWDOWN_TRIGGER,
    &pressure::WRITE_BUFFER_SIZE,
    &pressure::MAX_WRITE_BUFFERS,
    &pressure::WITHOUT_FLUSH_BUDGET,
    &curve::EXPONENT,
    &curve::MAX_THROTTLE,
    &write_gate::DISK_WRITE_LOCKED,
    &write_gate::RETRIABLE_WRITE,
    &write_gate::KV_CURVE,
    &write_gate::REASONS,
    &write_gate::PROBE_SENDS,
    &write_gate::SET_PROBE,
    &write_gate::PROBE_TTL,
    &write_gate::SET_PROBE_TTL,
    &write_gate::KV_JITTER,
    &write_gate::KV_HARD_REJECTION,
    &write_gate::WAKE_SLACK,
    &paced_writer::BATCH_BYTES,
    &paced_writer::MAX_RETRIES,
    &paced_writer::GATE,
    &paced_writer::DISK_BACKOFF,
    &paced_writer::KV_PRESSURE,
    &paced_writer::WAKE_SLACK,
    &window::MAX_IN_FLIGHT,
    &limiter::AIMD_INITIAL,
    &limiter::AIMD_MIN,
    &limiter::AIMD_MAX,
    &limiter::AIMD_BACKOFF_RATIO,
    &limiter::AIMD_TIMEOUT,
    &limiter::GRADIENT2_INITIAL,
    &limiter::GRADIENT2_MIN,
    &limiter::GRADIENT2_MAX,
    &limiter::GRADIENT2_SMOOTHING,
    &limiter::GRADIENT2_QUEUE_SIZE,
    &limiter::GRADIENT2_LONG_WINDOW,
    &limiter::GRADIENT2_RTT_TOLERANCE,
    &limiter::ALGORITHM_AIMD,
    &limiter::ALGORITHM_GRADIENT2,
    &limiter::WINDOW,
    &limiter::WINDOW_MIN_TIME,
    &limiter::WINDOW_MAX_TIME,
    &limiter::WINDOW_SIZE,
    &limiter::WINDOW_MIN_RTT_THRESHOLD,
    &batcher::MAX_REQUESTS_PER_BATCH,
    &batcher::MAX_BATCH_BYTES,
    &batcher::WINDOW,
    &batcher::OVERSIZED,
    &batcher::OP_TIMEOUT,
    &pending_bytes::MAX_PENDING_BYTES,
    &conn::MAX_IDLE,
    &conn::CONNECT_BACKOFF,
    &conn::MIN_CONNECT_TIMEOUT,
    &conn::BACKOFF_FROM,
    &failover::MAX_AUTO_RETRIES,
    &failover::CALL_BACKOFF,
    &failover::MAX_WAITERS,
    &failover::MAX_TOKENS,
    &failover::MILLI_TOKEN_RATIO,
    &failover::TTL,
    &failover::MIN_RETRIES_PER_SEC,
    &failover::PERCENT_CAN_RETRY,
    &failover::THROTTLING_BACKOFF,
    &failover::AWS_MAX_TOKENS,
    &failover::AWS_RETRY_COST,
    &failover::AWS_TIMEOUT_COST,
    &failover::AWS_THROTTLING_COST,
    &failover::AWS_NO_RETRY_INCREMENT,
];
