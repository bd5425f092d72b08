//! KV backpressure: the server's L0-driven write decision, the pressure signal on the wire, and
//! the client's throttle curve.
//!
//! Two halves cooperate so a slow RocksDB column family slows its producers down before its own
//! write stall can block an RPC handler:
//!
//! - **Server half** (`ServerPressure`, configured by `PressureConfig`): the column family's
//!   L0 file count becomes a `Decision`. Below the trigger `Tf` a write is accepted with no
//!   pressure; from `Tf` up to RocksDB's `level0_slowdown_writes_trigger` `Tr` it is accepted
//!   and carries the pressure `(L0 − Tf)/(Tr − Tf)`; at `L0 ≥ Tr` it is rejected with a
//!   retriable storage-backpressure error, so the handler never blocks.
//! - **Wire** ([`Signal`]): the pressure as parts per million, decoded from the protocol's
//!   `f32` by [`Signal::from_f32`]; a storage-backpressure rejection is [`Signal::Full`].
//! - **Client half** ([`ThrottleCurve`]): a signal becomes a throttle delay
//!   `⌊max_throttle_ms · ppm^k / 10^(6k)⌋` ms; `Full` gives `max_throttle`, so the ramp runs
//!   continuously into rejection.
//!
//! Every decision is integer arithmetic; floats appear only in [`Signal::from_f32`] and
//! [`Signal::to_f32`], at the wire.
//!

use core::time::Duration;

use crate::error::ConfigError;

/// One whole in parts per million: the pressure of a full (rejecting) server.
const PPM_ONE: u32 = 1_000_000;

// ---------------------------------------------------------------------------------------------
// Wire signal
// ---------------------------------------------------------------------------------------------

/// The backpressure a server reports for one bucket, in parts per million (ppm).
///
/// The three variants are ordered by severity. `Pressure(ppm)` is meant to hold
/// `0 < ppm < 1_000_000`; constructors here always normalise (see [`Signal::from_ppm`]), and
/// every consumer treats an out-of-range payload as its neighbour: `Pressure(0)` as `Clear`,
/// `Pressure(≥ 1_000_000)` as `Full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// No pressure: the client does not throttle.
    Clear,
    /// Pressure `ppm / 1_000_000`, strictly between 0 and 1.
    Pressure(u32),
    /// Full pressure, including a storage-backpressure rejection: the client throttles for
    /// the curve's whole ceiling.
    Full,
}

impl Signal {
    /// Decodes the protocol's `f32` pressure.
    ///
    /// - NaN, `-inf`, `-0.0`, `0.0` and anything negative → [`Signal::Clear`];
    /// - `1.0`, anything larger and `+inf` → [`Signal::Full`];
    /// - `0 < x < 1` → `x · 10⁶` rounded to the nearest ppm, ties upward, computed exactly from
    ///   the float's bits (no float arithmetic, so every target rounds alike). A value that
    ///   rounds to 0 ppm (`x < 5·10⁻⁷`, subnormals included) is `Clear`, and one that rounds to
    ///   1 000 000 ppm (`x ≥ 0.9999995`) is `Full`: the mapping is monotone in `x`, and agrees
    ///   with [`ThrottleCurve::delay`], which gives 0 at 0 ppm and the ceiling at 10⁶ ppm.
    ///
    /// ```
    /// use throttle_core::backpressure::Signal;
    ///
    /// assert_eq!(Signal::from_f32(0.9), Signal::Pressure(900_000));
    /// assert_eq!(Signal::from_f32(f32::NAN), Signal::Clear);
    /// assert_eq!(Signal::from_f32(1e-7), Signal::Clear); // 0.1 ppm rounds to 0
    /// assert_eq!(Signal::from_f32(0.9999999), Signal::Full); // 999 999.88 ppm rounds to 10⁶
    /// ```
    pub fn from_f32(x: f32) -> Signal {
        if x.is_nan() || x <= 0.0 {
            return Signal::Clear;
        }
        if x >= 1.0 {
            return Signal::Full;
        }
        // Here 0 < x < 1 and finite: x = mantissa · 2^-shift exactly, with shift ≥ 24.
        let bits = x.to_bits();
        let biased_exponent = (bits >> 23) & 0xff;
        let fraction = bits & 0x007f_ffff;
        let (mantissa, shift) = if biased_exponent == 0 {
            (fraction, 149) // subnormal
        } else {
            (
                fraction | 0x0080_0000,
                150u32.saturating_sub(biased_exponent),
            )
        };
        // mantissa < 2^24, so the product stays below 2^44.
        let scaled = u64::from(mantissa) * u64::from(PPM_ONE);
        let ppm = if shift >= 64 {
            0 // below 2^-40: far under half a ppm
        } else {
            // Round half up: add half of the divisor before shifting (cannot overflow: < 2^63 + 2^44).
            scaled.saturating_add(1u64 << (shift - 1)) >> shift
        };
        Signal::from_ppm(u32::try_from(ppm).unwrap_or(PPM_ONE))
    }

    /// The signal for `ppm` parts per million: 0 → `Clear`, 10⁶ or more → `Full`.
    pub const fn from_ppm(ppm: u32) -> Signal {
        if ppm == 0 {
            Signal::Clear
        } else if ppm >= PPM_ONE {
            Signal::Full
        } else {
            Signal::Pressure(ppm)
        }
    }

    /// The pressure in ppm, in `0..=1_000_000`: `Clear` is 0, `Full` is 10⁶, and an
    /// out-of-range `Pressure` payload is clamped.
    pub const fn ppm(self) -> u32 {
        match self {
            Signal::Clear => 0,
            Signal::Pressure(ppm) if ppm >= PPM_ONE => PPM_ONE,
            Signal::Pressure(ppm) => ppm,
            Signal::Full => PPM_ONE,
        }
    }

    /// The `f32` to put on the wire (`Clear` 0.0, `Full` 1.0).
    ///
    /// [`Signal::from_f32`] decodes it back to the same signal for every ppm value: `ppm` is
    /// exact in an `f32` and the division is off by far less than half a ppm.
    pub fn to_f32(self) -> f32 {
        // `ppm()` ≤ 10⁶ < 2^24, so the conversion is exact.
        self.ppm() as f32 / PPM_ONE as f32
    }
}

// ---------------------------------------------------------------------------------------------
// Client half
// ---------------------------------------------------------------------------------------------

/// The client's throttle curve: how long to hold a bucket back for a server [`Signal`].
///
/// `delay = ⌊max_throttle_ms · ppm^k / 10^(6k)⌋` ms, computed exactly in `u128`
/// (`u32::MAX · (10⁶)⁴ < 2^112`). `Clear` and 0 ppm give zero; `Full` and 10⁶ ppm or more give
/// `max_throttle`, so a rejection continues the ramp. The delay is monotone in the pressure and
/// never above `max_throttle`.
///
/// Default: the proposal's cubic ramp, `k = 3`, `max_throttle = 5000 ms`.
///
/// ```
/// use core::time::Duration;
/// use throttle_core::backpressure::{Signal, ThrottleCurve};
///
/// // Upstream's own example: 1000 ms ceiling, p = 0.9, quadratic → 810 ms.
/// let curve = ThrottleCurve::builder()
///     .exponent(2)
///     .max_throttle(Duration::from_millis(1000))
///     .build()?;
/// assert_eq!(curve.delay(Signal::from_f32(0.9)), Duration::from_millis(810));
/// assert_eq!(curve.delay(Signal::Full), Duration::from_millis(1000));
/// # Ok::<(), throttle_core::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ThrottleCurve {
    exponent: u32,
    max_throttle_ms: u32,
}

/// The option names [`ThrottleCurve`] validation reports.
const OPT_MAX_THROTTLE: &str = "client.writer.kv-backpressure.max-throttle-ms";
const OPT_EXPONENT: &str = "client.writer.kv-backpressure.exponent";

impl Default for ThrottleCurve {
    fn default() -> Self {
        ThrottleCurve {
            exponent: 3,
            max_throttle_ms: 5_000,
        }
    }
}

impl ThrottleCurve {
    /// The smallest exponent `k` accepted.
    pub const MIN_EXPONENT: u32 = 1;
    /// The largest exponent `k` accepted (keeps the exact product within `u128`).
    pub const MAX_EXPONENT: u32 = 4;

    /// The curve Fluss landed: quadratic (`k = 2`), 3000 ms ceiling. Pair it with
    /// the landed server trigger on the server.
    pub const fn fluss_landed() -> Self {
        ThrottleCurve {
            exponent: 2,
            max_throttle_ms: 3_000,
        }
    }

    /// A builder starting from the default curve.
    pub fn builder() -> ThrottleCurveBuilder {
        ThrottleCurveBuilder {
            curve: ThrottleCurve::default(),
            max_throttle: None,
        }
    }

    /// A builder starting from this curve.
    pub fn to_builder(&self) -> ThrottleCurveBuilder {
        ThrottleCurveBuilder {
            curve: *self,
            max_throttle: None,
        }
    }

    /// The exponent `k`.
    pub const fn exponent(&self) -> u32 {
        self.exponent
    }

    /// The ceiling: the delay for [`Signal::Full`].
    pub const fn max_throttle(&self) -> Duration {
        Duration::from_millis(self.max_throttle_ms as u64)
    }

    /// How long to throttle a bucket that reported `signal`.
    pub fn delay(&self, signal: Signal) -> Duration {
        Duration::from_millis(self.delay_ms(signal.ppm()))
    }

    /// The delay in whole milliseconds for `ppm` (already clamped to `0..=10⁶`).
    fn delay_ms(&self, ppm: u32) -> u64 {
        let max = u64::from(self.max_throttle_ms);
        if ppm == 0 {
            return 0;
        }
        if ppm >= PPM_ONE {
            return max;
        }
        // Validation keeps k ≤ 4, so neither power nor product can overflow; the fallbacks
        // only make that visible without a panic path.
        let Some(numerator) = u128::from(ppm)
            .checked_pow(self.exponent)
            .and_then(|p| p.checked_mul(u128::from(max)))
        else {
            return max;
        };
        let Some(denominator) = u128::from(PPM_ONE).checked_pow(self.exponent) else {
            return max;
        };
        u64::try_from(numerator / denominator).map_or(max, |d| d.min(max))
    }
}

/// Builds a validated [`ThrottleCurve`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ThrottleCurveBuilder {
    curve: ThrottleCurve,
    // Kept as given so `build` can refuse it with its real value.
    max_throttle: Option<Duration>,
}

impl ThrottleCurveBuilder {
    /// The exponent `k` of the curve, in `1..=4`.
    pub fn exponent(mut self, k: u32) -> Self {
        self.curve.exponent = k;
        self
    }

    /// The ceiling, a whole number of milliseconds up to `u32::MAX` ms (0 turns throttling
    /// off).
    pub fn max_throttle(mut self, max: Duration) -> Self {
        self.max_throttle = Some(max);
        self
    }

    /// The curve, or the first option out of range.
    pub fn build(self) -> Result<ThrottleCurve, ConfigError> {
        let mut curve = self.curve;
        if !(ThrottleCurve::MIN_EXPONENT..=ThrottleCurve::MAX_EXPONENT).contains(&curve.exponent) {
            return Err(ConfigError::OutOfRange {
                option: OPT_EXPONENT,
                got: u64::from(curve.exponent),
                min: u64::from(ThrottleCurve::MIN_EXPONENT),
                max: u64::from(ThrottleCurve::MAX_EXPONENT),
                unit: "",
            });
        }
        if let Some(max) = self.max_throttle {
            let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
            let Ok(ms32) = u32::try_from(ms) else {
                return Err(ConfigError::OutOfRange {
                    option: OPT_MAX_THROTTLE,
                    got: ms,
                    min: 0,
                    max: u64::from(u32::MAX),
                    unit: "ms",
                });
            };
            // The curve works in whole milliseconds, as upstream does; refuse rather than
            // silently truncate a finer ceiling.
            if max.subsec_nanos() % 1_000_000 != 0 {
                return Err(ConfigError::Invalid {
                    option: OPT_MAX_THROTTLE,
                    reason: "must be a whole number of milliseconds",
                });
            }
            curve.max_throttle_ms = ms32;
        }
        Ok(curve)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn curve(k: u32, max_ms: u64) -> ThrottleCurve {
        match ThrottleCurve::builder()
            .exponent(k)
            .max_throttle(ms(max_ms))
            .build()
        {
            Ok(c) => c,
            Err(e) => panic!("test curve refused: {e}"),
        }
    }

    // ---- wire signal --------------------------------------------------------------------

    #[test]
    fn from_f32_maps_nan_and_non_positive_to_clear() {
        for x in [
            f32::NAN,
            -f32::NAN,
            f32::NEG_INFINITY,
            f32::MIN,
            -1.0,
            -f32::MIN_POSITIVE,
            -f32::from_bits(1), // the negative subnormal closest to zero
            -0.0,
            0.0,
        ] {
            assert_eq!(Signal::from_f32(x), Signal::Clear, "{x:e}");
        }
    }

    #[test]
    fn from_f32_maps_one_and_above_to_full() {
        for x in [1.0, 1.000_000_1, 2.0, 1e30, f32::MAX, f32::INFINITY] {
            assert_eq!(Signal::from_f32(x), Signal::Full, "{x:e}");
        }
    }

    #[test]
    fn from_f32_rounds_to_the_nearest_ppm_ties_upward() {
        assert_eq!(Signal::from_f32(0.9), Signal::Pressure(900_000)); // 899 999.976 ppm
        assert_eq!(Signal::from_f32(0.5), Signal::Pressure(500_000));
        assert_eq!(Signal::from_f32(0.25), Signal::Pressure(250_000));
        assert_eq!(Signal::from_f32(0.999_999), Signal::Pressure(999_999)); // 999 998.987
        assert_eq!(Signal::from_f32(6e-7), Signal::Pressure(1)); // 0.600 ppm
        // 2^-7 is exactly 7812.5 ppm: the tie goes up.
        assert_eq!(Signal::from_f32(0.007_812_5), Signal::Pressure(7_813));
    }

    #[test]
    fn from_f32_maps_what_rounds_to_zero_ppm_to_clear() {
        for x in [
            1e-7,                      // 0.1 ppm
            5e-7,                      // the f32 nearest 5e-7 is 0.49999999874 ppm
            f32::from_bits(1),         // smallest subnormal
            f32::from_bits(0x7f_ffff), // largest subnormal
            f32::MIN_POSITIVE,
            f32::from_bits(0x3506_37bd), // the last f32 below half a ppm
        ] {
            assert_eq!(Signal::from_f32(x), Signal::Clear, "{x:e}");
        }
        // The next f32 is just over half a ppm.
        assert_eq!(
            Signal::from_f32(f32::from_bits(0x3506_37be)),
            Signal::Pressure(1)
        );
    }

    #[test]
    fn from_f32_maps_what_rounds_to_a_whole_to_full() {
        // 0.9999999 is 999 999.88 ppm; the largest f32 below 1 is 999 999.94 ppm.
        assert_eq!(Signal::from_f32(0.999_999_9), Signal::Full);
        assert_eq!(Signal::from_f32(f32::from_bits(0x3f7f_ffff)), Signal::Full);
        // 999 999.52 ppm rounds up to a whole; 999 999.46 ppm stays just below.
        assert_eq!(Signal::from_f32(f32::from_bits(0x3f7f_fff8)), Signal::Full);
        assert_eq!(
            Signal::from_f32(f32::from_bits(0x3f7f_fff7)),
            Signal::Pressure(999_999)
        );
    }

    /// The reference rounding: `x · 10⁶` is exact in `f64` (24 + 20 bits), and so is adding a
    /// half for every value that can round to a non-zero ppm.
    fn reference_ppm(x: f32) -> u64 {
        (f64::from(x) * 1e6 + 0.5) as u64
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn from_f32_is_exact_and_monotone_over_every_float_between_zero_and_one() {
        let mut previous = 0;
        // Every 997th bit pattern of (0, 1), in order, plus every pattern near both ends.
        const ONE: u32 = 0x3f80_0000;
        let bits = (1..5_000)
            .chain((5_000..ONE - 5_000).step_by(997))
            .chain(ONE - 5_000..ONE);
        for b in bits {
            let x = f32::from_bits(b);
            let got = Signal::from_f32(x);
            let want = Signal::from_ppm(u32::try_from(reference_ppm(x)).unwrap_or(u32::MAX));
            assert_eq!(got, want, "bits {b:#x} ({x:e})");
            assert!(got.ppm() >= previous, "not monotone at {b:#x}");
            previous = got.ppm();
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn to_f32_round_trips_every_ppm() {
        for ppm in 0..=PPM_ONE {
            let signal = Signal::from_ppm(ppm);
            assert_eq!(Signal::from_f32(signal.to_f32()), signal, "ppm {ppm}");
        }
        assert_eq!(Signal::Clear.to_f32(), 0.0);
        assert_eq!(Signal::Full.to_f32(), 1.0);
    }

    #[test]
    fn from_ppm_and_ppm_normalise_the_edges() {
        assert_eq!(Signal::from_ppm(0), Signal::Clear);
        assert_eq!(Signal::from_ppm(1), Signal::Pressure(1));
        assert_eq!(Signal::from_ppm(999_999), Signal::Pressure(999_999));
        assert_eq!(Signal::from_ppm(1_000_000), Signal::Full);
        assert_eq!(Signal::from_ppm(u32::MAX), Signal::Full);
        assert_eq!(Signal::Clear.ppm(), 0);
        assert_eq!(Signal::Full.ppm(), 1_000_000);
        assert_eq!(Signal::Pressure(0).ppm(), 0);
        assert_eq!(Signal::Pressure(u32::MAX).ppm(), 1_000_000);
    }

    // ---- client curve -------------------------------------------------------------------

    #[test]
    fn exact_product_fits_u128() {
        // The largest numerator the curve forms: u32::MAX ms · (10⁶)⁴.
        let biggest = u128::from(u32::MAX).checked_mul(10u128.pow(24));
        assert!(biggest.is_some_and(|b| b < u128::MAX / 2));
    }

    #[test]
    fn upstream_example_quadratic_1000ms_at_p_0_9_is_810ms() {
        let c = curve(2, 1_000);
        assert_eq!(c.delay(Signal::from_f32(0.9)), ms(810));
        assert_eq!(c.delay(Signal::Pressure(500_000)), ms(250));
    }

    #[test]
    fn presets_match_the_proposal_and_the_landed_curve() {
        let default = ThrottleCurve::default();
        assert_eq!((default.exponent(), default.max_throttle()), (3, ms(5_000)));
        assert_eq!(default.delay(Signal::Pressure(500_000)), ms(625)); // 5000 · 0.5³
        let landed = ThrottleCurve::fluss_landed();
        assert_eq!((landed.exponent(), landed.max_throttle()), (2, ms(3_000)));
        assert_eq!(landed.delay(Signal::Pressure(500_000)), ms(750)); // 3000 · 0.5²
        assert_eq!(landed.delay(Signal::Pressure(900_000)), ms(2_430));
    }

    #[test]
    fn clear_and_zero_ppm_give_no_delay_full_and_whole_give_the_ceiling() {
        for k in 1..=4 {
            let c = curve(k, 5_000);
            assert_eq!(c.delay(Signal::Clear), Duration::ZERO);
            assert_eq!(c.delay(Signal::Pressure(0)), Duration::ZERO);
            assert_eq!(c.delay(Signal::Pressure(1)), Duration::ZERO);
            assert_eq!(c.delay(Signal::Full), ms(5_000));
            assert_eq!(c.delay(Signal::Pressure(1_000_000)), ms(5_000));
            assert_eq!(c.delay(Signal::Pressure(u32::MAX)), ms(5_000));
        }
    }

    #[test]
    fn delay_floors_to_whole_milliseconds_at_the_extremes() {
        // Values from exact rational arithmetic: ⌊max · ppm^k / 10^(6k)⌋.
        let huge = curve(4, u64::from(u32::MAX));
        assert_eq!(huge.delay(Signal::Pressure(999_999)), ms(4_294_950_115));
        assert_eq!(huge.delay(Signal::Full), ms(u64::from(u32::MAX)));
        assert_eq!(
            curve(1, u64::from(u32::MAX)).delay(Signal::Pressure(1)),
            ms(4_294)
        );
        assert_eq!(
            ThrottleCurve::default().delay(Signal::Pressure(999_999)),
            ms(4_999)
        );
        assert_eq!(curve(1, 5_000).delay(Signal::Pressure(999_999)), ms(4_999));
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn curve_is_monotone_zero_at_clear_and_never_above_the_ceiling() {
        for k in 1..=4 {
            for max in [0, 1, 3_000, 5_000, u64::from(u32::MAX)] {
                let c = curve(k, max);
                let mut previous = Duration::ZERO;
                for ppm in (0..999_990).step_by(7).chain(999_990..=1_000_001) {
                    let d = c.delay(Signal::Pressure(ppm));
                    assert!(d >= previous, "k {k} max {max} ppm {ppm}");
                    assert!(d <= ms(max), "k {k} max {max} ppm {ppm}");
                    previous = d;
                }
                assert_eq!(previous, ms(max));
            }
        }
    }

    #[test]
    fn curve_validation_bounds_on_both_sides() {
        let exponent = |got| ConfigError::OutOfRange {
            option: "client.writer.kv-backpressure.exponent",
            got,
            min: 1,
            max: 4,
            unit: "",
        };
        assert_eq!(
            ThrottleCurve::builder().exponent(0).build(),
            Err(exponent(0))
        );
        assert_eq!(
            ThrottleCurve::builder().exponent(5).build(),
            Err(exponent(5))
        );
        assert_eq!(
            ThrottleCurve::builder().exponent(u32::MAX).build(),
            Err(exponent(u64::from(u32::MAX)))
        );
        assert_eq!(curve(1, 5_000).exponent(), 1);
        assert_eq!(curve(4, 5_000).exponent(), 4);

        let max = |got| ConfigError::OutOfRange {
            option: "client.writer.kv-backpressure.max-throttle-ms",
            got,
            min: 0,
            max: u64::from(u32::MAX),
            unit: "ms",
        };
        // 0 ms is accepted: throttling off, a rejection throttles for nothing.
        assert_eq!(curve(3, 0).delay(Signal::Full), Duration::ZERO);
        assert_eq!(
            curve(3, u64::from(u32::MAX)).max_throttle(),
            ms(u64::from(u32::MAX))
        );
        let over = ms(u64::from(u32::MAX) + 1);
        assert_eq!(
            ThrottleCurve::builder().max_throttle(over).build(),
            Err(max(u64::from(u32::MAX) + 1))
        );
        assert_eq!(
            ThrottleCurve::builder().max_throttle(Duration::MAX).build(),
            Err(max(u64::MAX))
        );
        let fractional = ConfigError::Invalid {
            option: "client.writer.kv-backpressure.max-throttle-ms",
            reason: "must be a whole number of milliseconds",
        };
        for d in [Duration::from_nanos(999_999), Duration::from_micros(1_500)] {
            assert_eq!(
                ThrottleCurve::builder().max_throttle(d).build(),
                Err(fractional)
            );
        }
    }

    #[test]
    fn to_builder_keeps_the_curve_and_changes_one_option() {
        let landed = ThrottleCurve::fluss_landed();
        assert_eq!(landed.to_builder().build(), Ok(landed));
        let changed = landed.to_builder().max_throttle(ms(1_000)).build();
        assert_eq!(changed, Ok(curve(2, 1_000)));
    }
}
