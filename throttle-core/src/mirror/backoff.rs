//! [`BackoffConfig`]'s mirror.

use core::cell::Cell;
use core::fmt;
use core::marker::PhantomData;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, Unexpected, VariantAccess, Visitor,
};
use serde::{Deserialize, Serialize};

use super::leaf::{Leaf, field, ms_in_ns, ser_enum, ser_pair, to_ms, to_ns, unit_enums};
use super::via_mirror;
use crate::backoff::{BackoffConfig, BackoffConfigBuilder, Jitter, JitterOrder};
use crate::error::ConfigError;
use crate::options::backoff as opt;

/// Which constructor a backoff's option names and bounds come from: a preset's builder keeps
/// its preset's bounds (Fluss's `1 ms ≤ initial ≤ max ≤ 2 147 483 647 ms`) and reports its
/// own upstream keys, so the preset is part of what a file says.
///
/// Written as the constructor's name: `"builder"` for [`BackoffConfig::builder`] (general
/// rules), `"fluss_disk_write_locked"`, `"fluss_retriable_write"`, `"kafka_retry"`,
/// `"grpc_connection"`, `"gobblin_throttling_client"`. The preset gives only the rules: every
/// value is the file's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackoffPreset {
    /// [`BackoffConfig::builder`]: general rules, `initial ≤ max`.
    Builder,
    /// [`BackoffConfig::fluss_disk_write_locked`].
    FlussDiskWriteLocked,
    /// [`BackoffConfig::fluss_retriable_write`].
    FlussRetriableWrite,
    /// [`BackoffConfig::kafka_retry`].
    KafkaRetry,
    /// [`BackoffConfig::grpc_connection`].
    GrpcConnection,
    /// [`BackoffConfig::gobblin_throttling_client`].
    GobblinThrottlingClient,
}

impl BackoffPreset {
    /// Every preset but [`BackoffPreset::Builder`], with its constructor.
    const PRESETS: [(BackoffPreset, fn() -> BackoffConfig); 5] = [
        (
            BackoffPreset::FlussDiskWriteLocked,
            BackoffConfig::fluss_disk_write_locked,
        ),
        (
            BackoffPreset::FlussRetriableWrite,
            BackoffConfig::fluss_retriable_write,
        ),
        (BackoffPreset::KafkaRetry, BackoffConfig::kafka_retry),
        (
            BackoffPreset::GrpcConnection,
            BackoffConfig::grpc_connection,
        ),
        (
            BackoffPreset::GobblinThrottlingClient,
            BackoffConfig::gobblin_throttling_client,
        ),
    ];

    /// The preset whose rules `cfg` was built under.
    fn of(cfg: &BackoffConfig) -> Self {
        Self::PRESETS
            .iter()
            .find(|(_, preset)| cfg.same_rules(&preset()))
            .map_or(BackoffPreset::Builder, |(name, _)| *name)
    }

    /// A builder with this preset's rules.
    fn builder(self) -> BackoffConfigBuilder {
        Self::PRESETS
            .iter()
            .find(|(name, _)| *name == self)
            .map_or_else(BackoffConfig::builder, |(_, preset)| preset().to_builder())
    }
}

unit_enums! {
    BackoffPreset {
        "builder" => BackoffPreset::Builder,
        "fluss_disk_write_locked" => BackoffPreset::FlussDiskWriteLocked,
        "fluss_retriable_write" => BackoffPreset::FlussRetriableWrite,
        "kafka_retry" => BackoffPreset::KafkaRetry,
        "grpc_connection" => BackoffPreset::GrpcConnection,
        "gobblin_throttling_client" => BackoffPreset::GobblinThrottlingClient,
    }
    JitterOrder {
        "jitter_then_cap" => JitterOrder::JitterThenCap,
        "cap_then_jitter" => JitterOrder::CapThenJitter,
    }
}

/// [`Jitter`] as written: `"none"`, `"full"`, `"equal"`, `"decorrelated"`, or a one-key
/// object for a strategy with a parameter: `{"proportional": {"ppm": 200000}}`,
/// `{"additive": {"range_ms": 500}}`, `{"per_delay": {"ppm": 1000000}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum JitterMirror {
    /// [`Jitter::None`].
    None,
    /// [`Jitter::Proportional`].
    Proportional {
        /// Half-width of the factor's range, in ppm.
        ppm: u32,
    },
    /// [`Jitter::Additive`].
    Additive {
        /// Width of the offset's range, in ms.
        range_ms: u64,
    },
    /// [`Jitter::Full`].
    Full,
    /// [`Jitter::Equal`].
    Equal,
    /// [`Jitter::Decorrelated`].
    Decorrelated,
    /// [`Jitter::PerDelay`].
    PerDelay {
        /// Width of the factor's range above 1, in ppm.
        ppm: u32,
    },
}

/// The parameter of [`JitterMirror::Proportional`] and [`JitterMirror::PerDelay`].
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "`jitter`'s parameters: an object {\"ppm\": n}"
)]
struct PpmBody {
    #[serde(deserialize_with = "field::ppm")]
    ppm: u32,
}

/// The parameter of [`JitterMirror::Additive`].
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "`jitter`'s parameters: an object {\"range_ms\": n}"
)]
struct RangeBody {
    #[serde(deserialize_with = "field::range_ms")]
    range_ms: u64,
}

/// The strategies by name, in the order of [`JitterMirror`].
const STRATEGIES: &[&str] = &[
    "none",
    "proportional",
    "additive",
    "full",
    "equal",
    "decorrelated",
    "per_delay",
];

/// Reads a jitter with the field's name in every error, an unknown strategy included (the
/// derived reader names only the strategies).
impl Leaf for JitterMirror {
    fn read<'de, D: Deserializer<'de>>(d: D, name: &'static str) -> Result<Self, D::Error> {
        d.deserialize_enum("JitterMirror", STRATEGIES, JitterVisitor(name))
    }
}

struct JitterVisitor(&'static str);

impl JitterVisitor {
    fn expected(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`, one of ", self.0)?;
        for (i, strategy) in STRATEGIES.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "`{strategy}`")?;
        }
        Ok(())
    }
}

impl JitterVisitor {
    /// The parameters of `strategy`. An error from inside them names their own field; one
    /// before them (the strategy written without parameters) is wrapped to name this field.
    fn parameters<'de, A: EnumAccess<'de>, T: Deserialize<'de>>(
        &self,
        body: A::Variant,
        strategy: &'static str,
    ) -> Result<T, A::Error> {
        let entered = Cell::new(false);
        body.newtype_variant_seed(Entered(&entered, PhantomData))
            .map_err(|e| match entered.get() {
                true => e,
                false => de::Error::custom(format_args!(
                    "`{}`: `{strategy}` takes parameters ({e})",
                    self.0
                )),
            })
    }
}

/// Reads `T`, noting that the reading started.
struct Entered<'a, T>(&'a Cell<bool>, PhantomData<T>);

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Entered<'_, T> {
    type Value = T;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        self.0.set(true);
        T::deserialize(d)
    }
}

impl<'de> Visitor<'de> for JitterVisitor {
    type Value = JitterMirror;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.expected(f)
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<JitterMirror, A::Error> {
        let (strategy, body) = data.variant_seed(StrategySeed(self.0))?;
        Ok(match strategy {
            0 => body.unit_variant().map(|()| JitterMirror::None)?,
            1 => JitterMirror::Proportional {
                ppm: self.parameters::<A, PpmBody>(body, "proportional")?.ppm,
            },
            2 => JitterMirror::Additive {
                range_ms: self.parameters::<A, RangeBody>(body, "additive")?.range_ms,
            },
            3 => body.unit_variant().map(|()| JitterMirror::Full)?,
            4 => body.unit_variant().map(|()| JitterMirror::Equal)?,
            5 => body.unit_variant().map(|()| JitterMirror::Decorrelated)?,
            _ => JitterMirror::PerDelay {
                ppm: self.parameters::<A, PpmBody>(body, "per_delay")?.ppm,
            },
        })
    }
}

/// A strategy's name, as its index in [`STRATEGIES`].
struct StrategySeed(&'static str);

impl<'de> DeserializeSeed<'de> for StrategySeed {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for StrategySeed {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        JitterVisitor(self.0).expected(f)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<usize, E> {
        STRATEGIES
            .iter()
            .position(|s| *s == v)
            .ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<usize, E> {
        usize::try_from(v)
            .ok()
            .filter(|i| *i < STRATEGIES.len())
            .ok_or_else(|| E::invalid_value(Unexpected::Unsigned(v), &self))
    }
}

impl<'de> Deserialize<'de> for JitterMirror {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::read(d, "jitter")
    }
}

impl TryFrom<Jitter> for JitterMirror {
    type Error = ConfigError;
    fn try_from(jitter: Jitter) -> Result<Self, ConfigError> {
        Ok(match jitter {
            Jitter::None => JitterMirror::None,
            Jitter::Proportional { ppm } => JitterMirror::Proportional { ppm },
            Jitter::Additive { range } => JitterMirror::Additive {
                range_ms: to_ms(&opt::JITTER, range)?,
            },
            Jitter::Full => JitterMirror::Full,
            Jitter::Equal => JitterMirror::Equal,
            Jitter::Decorrelated => JitterMirror::Decorrelated,
            Jitter::PerDelay { ppm } => JitterMirror::PerDelay { ppm },
        })
    }
}

impl From<JitterMirror> for Jitter {
    fn from(jitter: JitterMirror) -> Self {
        match jitter {
            JitterMirror::None => Jitter::None,
            JitterMirror::Proportional { ppm } => Jitter::Proportional { ppm },
            // A `Duration` holds any count of ms; the backoff saturates the offset's width
            // like every span it is given.
            JitterMirror::Additive { range_ms } => Jitter::Additive {
                range: core::time::Duration::from_millis(range_ms),
            },
            JitterMirror::Full => Jitter::Full,
            JitterMirror::Equal => Jitter::Equal,
            JitterMirror::Decorrelated => Jitter::Decorrelated,
            JitterMirror::PerDelay { ppm } => Jitter::PerDelay { ppm },
        }
    }
}

/// [`BackoffConfig`] as written: the eleven options of [`BackoffConfigBuilder`] and the
/// preset whose rules it is checked against.
///
/// Spans are whole milliseconds, except `resolution_ns`. `total_budget_ms`, `max_attempts`
/// and `max_wait_ms` may be left out (no limit). Converting back runs
/// [`BackoffConfigBuilder::build`] on the preset's builder, so every rule of the builder
/// applies; a `_ms` span past `u64::MAX` ns is refused (the builder would saturate it).
///
/// ```
/// use throttle_sansio::BackoffConfig;
/// use throttle_sansio::mirror::{BackoffConfigMirror, BackoffPreset};
///
/// let mut fluss = BackoffConfigMirror::try_from(&BackoffConfig::fluss_disk_write_locked())?;
/// assert_eq!(fluss.preset, BackoffPreset::FlussDiskWriteLocked);
/// assert_eq!((fluss.initial_ms, fluss.max_ms), (1_000, 10_000));
/// // The preset's bounds still apply: Fluss refuses an initial delay under 1 ms.
/// fluss.initial_ms = 0;
/// let err = BackoffConfig::try_from(fluss).unwrap_err();
/// assert!(err.to_string().contains("Fluss `client.writer.disk-write-locked.backoff`"));
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BackoffConfigMirror {
    /// The constructor whose option names and bounds apply.
    #[serde(serialize_with = "ser_enum", deserialize_with = "field::preset")]
    pub preset: BackoffPreset,
    /// [`BackoffConfigBuilder::initial`], in ms.
    #[serde(deserialize_with = "field::initial_ms")]
    pub initial_ms: u64,
    /// [`BackoffConfigBuilder::max`], in ms.
    #[serde(deserialize_with = "field::max_ms")]
    pub max_ms: u64,
    /// [`BackoffConfigBuilder::multiplier`], `[num, den]`.
    #[serde(serialize_with = "ser_pair", deserialize_with = "field::multiplier")]
    pub multiplier: (u32, u32),
    /// [`BackoffConfigBuilder::jitter`].
    #[serde(deserialize_with = "field::jitter")]
    pub jitter: JitterMirror,
    /// [`BackoffConfigBuilder::floor`], in ms.
    #[serde(deserialize_with = "field::floor_ms")]
    pub floor_ms: u64,
    /// [`BackoffConfigBuilder::resolution`], in ns.
    #[serde(deserialize_with = "field::resolution_ns")]
    pub resolution_ns: u64,
    /// [`BackoffConfigBuilder::total_budget`], in ms.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "field::total_budget_ms"
    )]
    pub total_budget_ms: Option<u64>,
    /// [`BackoffConfigBuilder::max_attempts`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "field::max_attempts"
    )]
    pub max_attempts: Option<u32>,
    /// [`BackoffConfigBuilder::max_wait`], in ms.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "field::max_wait_ms"
    )]
    pub max_wait_ms: Option<u64>,
    /// [`BackoffConfigBuilder::jitter_order`].
    #[serde(serialize_with = "ser_enum", deserialize_with = "field::jitter_order")]
    pub jitter_order: JitterOrder,
    /// [`BackoffConfigBuilder::first_delay_unjittered`].
    #[serde(deserialize_with = "field::first_delay_unjittered")]
    pub first_delay_unjittered: bool,
}

impl TryFrom<&BackoffConfig> for BackoffConfigMirror {
    type Error = ConfigError;
    /// Refuses a span with a sub-millisecond part in a `_ms` field.
    fn try_from(cfg: &BackoffConfig) -> Result<Self, ConfigError> {
        let opt_ms = |option, d: Option<core::time::Duration>| match d {
            Some(d) => to_ms(option, d).map(Some),
            None => Ok(None),
        };
        Ok(BackoffConfigMirror {
            preset: BackoffPreset::of(cfg),
            initial_ms: to_ms(&opt::INITIAL, cfg.initial())?,
            max_ms: to_ms(&opt::MAX, cfg.max())?,
            multiplier: cfg.multiplier(),
            jitter: JitterMirror::try_from(cfg.jitter())?,
            floor_ms: to_ms(&opt::FLOOR, cfg.floor())?,
            resolution_ns: to_ns(cfg.resolution()),
            total_budget_ms: opt_ms(&opt::TOTAL_BUDGET, cfg.total_budget())?,
            max_attempts: cfg.max_attempts(),
            max_wait_ms: opt_ms(&opt::MAX_WAIT, cfg.max_wait())?,
            jitter_order: cfg.jitter_order(),
            first_delay_unjittered: cfg.first_delay_unjittered(),
        })
    }
}

impl TryFrom<BackoffConfigMirror> for BackoffConfig {
    type Error = ConfigError;
    /// The preset's builder with every option of the mirror, built.
    fn try_from(m: BackoffConfigMirror) -> Result<Self, ConfigError> {
        let opt_ms = |option, ms: Option<u64>| match ms {
            Some(ms) => ms_in_ns(option, ms).map(Some),
            None => Ok(None),
        };
        let (num, den) = m.multiplier;
        m.preset
            .builder()
            .initial(ms_in_ns(&opt::INITIAL, m.initial_ms)?)
            .max(ms_in_ns(&opt::MAX, m.max_ms)?)
            .multiplier(num, den)
            .jitter(m.jitter.into())
            .floor(ms_in_ns(&opt::FLOOR, m.floor_ms)?)
            .resolution(core::time::Duration::from_nanos(m.resolution_ns))
            .total_budget(opt_ms(&opt::TOTAL_BUDGET, m.total_budget_ms)?)
            .max_attempts(m.max_attempts)
            .max_wait(opt_ms(&opt::MAX_WAIT, m.max_wait_ms)?)
            .jitter_order(m.jitter_order)
            .first_delay_unjittered(m.first_delay_unjittered)
            .build()
    }
}

via_mirror!(BackoffConfig, BackoffConfigMirror);
