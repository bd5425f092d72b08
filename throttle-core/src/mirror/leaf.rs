//! Leaf values that name their field in every error, and the ms/ns conversions.
//!
//! A derived `Deserialize` reports a wrong type or an integer out of its type's range as
//! "invalid type: string, expected u64" (serde's primitive visitors name the type, not the
//! field). Every scalar field of a mirror is therefore read by [`Leaf::read`] through a
//! function of [`field`] named after the field, whose visitor's `expecting` names it: the
//! message becomes "invalid type: string \"x\", expected `initial_ms`, an integer in
//! 0..=18446744073709551615". Nothing here allocates.

use core::fmt;
use core::marker::PhantomData;
use core::num::{NonZeroU64, NonZeroUsize};
use core::time::Duration;

use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Unexpected, Visitor};
use serde::ser::{SerializeTuple, Serializer};

use crate::error::ConfigError;
use crate::options::ConfigOption;

/// A scalar a mirror field holds, read with its field's name in every error.
pub(super) trait Leaf: Sized {
    /// Reads the value of the field `name`.
    fn read<'de, D: Deserializer<'de>>(d: D, name: &'static str) -> Result<Self, D::Error>;
}

/// One function per scalar field name, each reading its field's [`Leaf`] (`deserialize_with`
/// takes a path, so the name must be in the function).
pub(super) mod field {
    use super::Leaf;
    use serde::de::Deserializer;

    macro_rules! fields {
        ($($name:ident)*) => {$(
            pub(in crate::mirror) fn $name<'de, D: Deserializer<'de>, T: Leaf>(
                d: D,
            ) -> Result<T, D::Error> {
                T::read(d, stringify!($name))
            }
        )*};
    }

    fields! {
        preset initial_ms max_ms multiplier jitter jitter_order first_delay_unjittered floor_ms
        resolution_ns total_budget_ms max_attempts max_wait_ms ppm range_ms
        l0_trigger l0_slowdown_writes_trigger write_buffer_size max_write_buffers
        exponent max_throttle_ms kv_jitter_ppm probe_sends probe_ttl_ms wake_slack_ms
        batch_bytes max_retries disk_backoff kv_pressure max_in_flight
        kind max_requests_per_batch max_batch_bytes oversized op_timeout_ms max_pending_bytes
        max_idle_ms min_connect_timeout_ms backoff_from max_auto_retries max_waiters
        max_tokens milli_token_ratio ttl_ms min_retries_per_sec percent_can_retry_ppm
        retry_cost timeout_cost throttling_cost no_retry_increment
        min initial max backoff_ratio_ppm timeout_ms smoothing_ppm queue_size long_window
        rtt_tolerance_ppm min_window_ms max_window_ms window_size min_rtt_threshold_ns
    }
}

/// `Leaf::read` as a seed, for the elements of a tuple.
struct Seed<T>(&'static str, PhantomData<T>);

impl<'de, T: Leaf> DeserializeSeed<'de> for Seed<T> {
    type Value = T;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        T::read(d, self.0)
    }
}

/// An unsigned integer type a field may hold: its range, and the conversion from `u64`.
pub(super) trait Int: Sized {
    /// The smallest and largest value, for the message.
    const RANGE: (u64, u64);
    /// The value, if `v` is in range.
    fn from_u64(v: u64) -> Option<Self>;
}

/// Each type is read with the hint of the type it serialises as (`u32` as `u32`, the others
/// as `u64`), so formats with fixed-width integers read what they wrote.
macro_rules! ints {
    ($($t:ty => $hint:ident, $min:expr, $max:expr, $from:expr;)*) => {$(
        impl Int for $t {
            const RANGE: (u64, u64) = ($min, $max);
            fn from_u64(v: u64) -> Option<Self> {
                $from(v)
            }
        }
        impl Leaf for $t {
            fn read<'de, D: Deserializer<'de>>(d: D, name: &'static str) -> Result<Self, D::Error> {
                d.$hint(IntVisitor::<$t>(name, PhantomData))
            }
        }
    )*};
}

ints! {
    u32 => deserialize_u32, 0, u32::MAX as u64, |v| u32::try_from(v).ok();
    u64 => deserialize_u64, 0, u64::MAX, Some;
    usize => deserialize_u64, 0, usize::MAX as u64, |v| usize::try_from(v).ok();
    NonZeroU64 => deserialize_u64, 1, u64::MAX, NonZeroU64::new;
    NonZeroUsize => deserialize_u64, 1, usize::MAX as u64,
        |v| usize::try_from(v).ok().and_then(NonZeroUsize::new);
}

struct IntVisitor<T>(&'static str, PhantomData<T>);

impl<'de, T: Int> Visitor<'de> for IntVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (min, max) = T::RANGE;
        write!(f, "`{}`, an integer in {min}..={max}", self.0)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        T::from_u64(v).ok_or_else(|| E::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        u64::try_from(v)
            .ok()
            .and_then(T::from_u64)
            .ok_or_else(|| E::invalid_value(Unexpected::Signed(v), &self))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<T, E> {
        u64::try_from(v)
            .ok()
            .and_then(T::from_u64)
            .ok_or_else(|| E::invalid_value(Unexpected::Other("a 128-bit integer"), &self))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<T, E> {
        u64::try_from(v)
            .ok()
            .and_then(T::from_u64)
            .ok_or_else(|| E::invalid_value(Unexpected::Other("a 128-bit integer"), &self))
    }
}

impl Leaf for bool {
    fn read<'de, D: Deserializer<'de>>(d: D, name: &'static str) -> Result<Self, D::Error> {
        struct V(&'static str);
        impl Visitor<'_> for V {
            type Value = bool;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "`{}`, a boolean", self.0)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
                Ok(v)
            }
        }
        d.deserialize_bool(V(name))
    }
}

impl<T: Leaf> Leaf for Option<T> {
    fn read<'de, D: Deserializer<'de>>(d: D, name: &'static str) -> Result<Self, D::Error> {
        struct V<T>(&'static str, PhantomData<T>);
        impl<'de, T: Leaf> Visitor<'de> for V<T> {
            type Value = Option<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "`{}`, a value or null", self.0)
            }
            fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
                Ok(None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
                T::read(d, self.0).map(Some)
            }
        }
        d.deserialize_option(V(name, PhantomData))
    }
}

/// A multiplier `(num, den)`, written `[num, den]`.
impl Leaf for (u32, u32) {
    fn read<'de, D: Deserializer<'de>>(d: D, name: &'static str) -> Result<Self, D::Error> {
        struct V(&'static str);
        impl<'de> Visitor<'de> for V {
            type Value = (u32, u32);
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "`{}`, an array [numerator, denominator] of two u32",
                    self.0
                )
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(u32, u32), A::Error> {
                let num = seq.next_element_seed(Seed(self.0, PhantomData))?;
                let num = num.ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let den = seq.next_element_seed(Seed(self.0, PhantomData))?;
                let den = den.ok_or_else(|| de::Error::invalid_length(1, &self))?;
                match seq.next_element::<de::IgnoredAny>()? {
                    None => Ok((num, den)),
                    Some(_) => Err(de::Error::invalid_length(3, &self)),
                }
            }
        }
        d.deserialize_tuple(2, V(name))
    }
}

/// Serialises a multiplier as `[num, den]`.
pub(super) fn ser_pair<S: Serializer>(v: &(u32, u32), s: S) -> Result<S::Ok, S::Error> {
    let mut t = s.serialize_tuple(2)?;
    t.serialize_element(&v.0)?;
    t.serialize_element(&v.1)?;
    t.end()
}

/// A fieldless enum written as one of its snake_case names.
pub(super) trait UnitEnum: Copy + PartialEq + 'static {
    /// Every variant with its name.
    const NAMES: &'static [(&'static str, Self)];
}

/// Every name of `T`, for the message: `` `a`, `b` ``.
struct Names<T>(PhantomData<T>);

impl<T: UnitEnum> fmt::Display for Names<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, _)) in T::NAMES.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "`{name}`")?;
        }
        Ok(())
    }
}

struct EnumVisitor<T>(&'static str, PhantomData<T>);

impl<T: UnitEnum> Visitor<'_> for EnumVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Names<T> = Names(PhantomData);
        write!(f, "`{}`, one of {names}", self.0)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        match T::NAMES.iter().find(|(name, _)| *name == v) {
            Some((_, value)) => Ok(*value),
            None => Err(E::invalid_value(Unexpected::Str(v), &self)),
        }
    }
}

/// Reads a [`UnitEnum`] (a blanket `Leaf` impl would overlap the others).
pub(super) fn read_enum<'de, D: Deserializer<'de>, T: UnitEnum>(
    d: D,
    name: &'static str,
) -> Result<T, D::Error> {
    d.deserialize_str(EnumVisitor(name, PhantomData))
}

/// Serialises a [`UnitEnum`] as its name.
pub(super) fn ser_enum<S: Serializer, T: UnitEnum>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    match T::NAMES.iter().find(|(_, value)| value == v) {
        Some((name, _)) => s.serialize_str(name),
        None => Err(serde::ser::Error::custom(
            "a variant without a serialised name",
        )),
    }
}

macro_rules! unit_enums {
    ($($t:ty { $($name:literal => $v:expr),* $(,)? })*) => {$(
        impl $crate::mirror::leaf::UnitEnum for $t {
            const NAMES: &'static [(&'static str, Self)] = &[$(($name, $v)),*];
        }
        impl $crate::mirror::leaf::Leaf for $t {
            fn read<'de, D: serde::Deserializer<'de>>(
                d: D,
                name: &'static str,
            ) -> Result<Self, D::Error> {
                $crate::mirror::leaf::read_enum(d, name)
            }
        }
    )*};
}
pub(super) use unit_enums;

const NS_PER_MS: u64 = 1_000_000;

/// A span as the whole milliseconds of its `_ms` field, or an error naming `option` when it
/// has a sub-millisecond part or exceeds `u64::MAX` ms (serialisation never rounds).
pub(super) fn to_ms(option: &'static ConfigOption, d: Duration) -> Result<u64, ConfigError> {
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(ConfigError::Invalid {
            option,
            reason: "is not a whole number of milliseconds, which its serialised `_ms` field \
                     counts",
        });
    }
    u64::try_from(d.as_millis()).map_err(|_| ConfigError::Invalid {
        option,
        reason: "is longer than u64::MAX milliseconds, which its serialised `_ms` field counts",
    })
}

/// [`to_ms`] of an optional span (an absent one stays absent).
pub(super) fn to_ms_opt(
    option: &'static ConfigOption,
    d: Option<Duration>,
) -> Result<Option<u64>, ConfigError> {
    d.map(|d| to_ms(option, d)).transpose()
}

/// Whole milliseconds as a span the backoff holds in `u64` nanoseconds, or an error naming
/// `option` past `u64::MAX` ns (the builder would count such a span as `u64::MAX` ns).
pub(super) fn ms_in_ns(option: &'static ConfigOption, ms: u64) -> Result<Duration, ConfigError> {
    match ms.checked_mul(NS_PER_MS) {
        Some(ns) => Ok(Duration::from_nanos(ns)),
        None => Err(ConfigError::OutOfRange {
            option,
            got: ms,
            min: 0,
            max: u64::MAX / NS_PER_MS,
            unit: "ms",
        }),
    }
}

/// A span the backoff holds in `u64` nanoseconds (its getters never exceed that).
pub(super) fn to_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
