//! Model check for [`crate::backpressure`]: random configurations (valid or not), random
//! sequences of L0 readings, pending bytes, refused writes, flushes and wire signals, against a
//! naive reference that shares no code with the machine.
//!
//! The reference recomputes everything from first principles in a different way: `u128`
//! sums instead of saturating `u64` ones, the ramp and the curve by binary search for the
//! largest value that does not overshoot (instead of one division), powers by repeated
//! multiplication, and the wire rounding in `f64` (where `x · 10⁶` is exact) instead of from
//! the float's bits.

use alloc::format;
use core::time::Duration;

use super::{Cursor, Divergence};
use crate::backpressure::{
    Decision, PressureConfig, RejectReason, ServerPressure, Signal, ThrottleCurve,
};
use crate::options::{ConfigOption, pressure as opt};

/// The reference's view of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Accept(u32),
    RejectSlowdown,
    RejectBudget,
    RejectLatched,
}

/// The naive server: the readings, the latch, and the configuration as plain numbers.
#[derive(Debug, Clone)]
struct RefServer {
    tf: u128,
    tr: u128,
    budget: Option<(u128, u128)>,
    l0: u128,
    pending: u128,
    latched: bool,
}

impl RefServer {
    /// `(L0 − Tf)/(Tr − Tf)` in ppm, nearest with ties up, found by searching for the largest
    /// `q` with `q · span ≤ above · 10⁶` and then looking at what is left over.
    fn ramp(&self) -> u32 {
        if self.l0 < self.tf {
            return 0;
        }
        if self.l0 >= self.tr {
            return 1_000_000;
        }
        let above = (self.l0 - self.tf) * 1_000_000;
        let span = self.tr - self.tf;
        let (mut lo, mut hi) = (0u128, 1_000_000u128);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if mid * span <= above {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let left_over = above - lo * span;
        let nearest = if 2 * left_over >= span { lo + 1 } else { lo };
        u32::try_from(nearest.min(999_999)).unwrap_or(999_999)
    }

    fn verdict(&self) -> Verdict {
        if self.l0 >= self.tr {
            return Verdict::RejectSlowdown;
        }
        if let Some((size, count)) = self.budget {
            let files = self.pending.div_ceil(size);
            if self.l0 + files + count >= self.tr {
                return Verdict::RejectBudget;
            }
        }
        if self.latched {
            return Verdict::RejectLatched;
        }
        Verdict::Accept(self.ramp())
    }

    fn gauge_ppm(&self) -> u32 {
        let ramp = self.ramp();
        if self.latched && ramp < 800_000 {
            800_000
        } else {
            ramp
        }
    }
}

/// Which options of a server configuration are wrong, from the documented bounds.
fn bad_server_options(
    tf: u32,
    tr: u32,
    budget: Option<(u64, u32)>,
) -> [Option<&'static ConfigOption>; 4] {
    let int_max = 2_147_483_647u32;
    let mut bad = [None; 4];
    if tf == 0 || tf > int_max || tf >= tr {
        bad[0] = Some(&opt::L0_TRIGGER);
    }
    if tr == 0 || tr > int_max {
        bad[1] = Some(&opt::SLOWDOWN_TRIGGER);
    }
    if let Some((size, count)) = budget {
        if size == 0 {
            bad[2] = Some(&opt::WRITE_BUFFER_SIZE);
        }
        if count == 0 || count > int_max || count >= tr {
            bad[3] = Some(&opt::MAX_WRITE_BUFFERS);
        }
    }
    bad
}

/// The naive curve: the largest whole `d ≤ max` with `d · 10^(6k) ≤ max · ppm^k`.
fn ref_delay_ms(k: u32, max_ms: u64, ppm: u32) -> u64 {
    let ppm = u128::from(ppm.min(1_000_000));
    let (mut power, mut scale) = (1u128, 1u128);
    for _ in 0..k {
        power *= ppm;
        scale *= 1_000_000;
    }
    let target = u128::from(max_ms) * power;
    let (mut lo, mut hi) = (0u64, max_ms);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if u128::from(mid) * scale <= target {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The naive wire decoding in `f64`: `x · 10⁶ + ½` is exact wherever it can matter.
fn ref_from_f32_ppm(x: f32) -> u32 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= 1.0 {
        1_000_000
    } else {
        (f64::from(x) * 1e6 + 0.5) as u32
    }
}

fn ref_signal_ppm(s: Signal) -> u32 {
    match s {
        Signal::Clear => 0,
        Signal::Pressure(p) => p.min(1_000_000),
        Signal::Full => 1_000_000,
    }
}

fn is_normal(s: Signal) -> bool {
    !matches!(s, Signal::Pressure(0) | Signal::Pressure(1_000_000..))
}

fn verdict_of(d: Decision) -> Verdict {
    match d {
        Decision::Accept { pressure_ppm } => Verdict::Accept(pressure_ppm),
        Decision::Reject {
            reason: RejectReason::SlowdownTrigger,
        } => Verdict::RejectSlowdown,
        Decision::Reject {
            reason: RejectReason::FlushBudget,
        } => Verdict::RejectBudget,
        Decision::Reject {
            reason: RejectReason::Latched,
        } => Verdict::RejectLatched,
    }
}

fn trigger(c: &mut Cursor<'_>) -> u32 {
    match c.u8() % 8 {
        0 => 0,
        1 => 2_147_483_647,
        2 => 2_147_483_648,
        3 => c.u32(),
        4 => u32::from(c.u16()),
        _ => u32::from(c.u8() % 40),
    }
}

fn write_buffer_size(c: &mut Cursor<'_>) -> u64 {
    match c.u8() % 6 {
        0 => 0,
        1 => u64::MAX,
        2 => c.u64(),
        3 => 64 << 20,
        _ => u64::from(c.u8() % 8),
    }
}

fn max_throttle(c: &mut Cursor<'_>) -> Duration {
    match c.u8() % 8 {
        0 => Duration::ZERO,
        1 => Duration::from_millis(u64::from(u32::MAX)),
        2 => Duration::from_millis(u64::from(u32::MAX) + 1),
        3 => Duration::from_nanos(c.u64()), // usually not whole milliseconds
        4 => Duration::MAX,
        5 => Duration::from_millis(u64::from(c.u32())),
        _ => Duration::from_millis(u64::from(c.u16())),
    }
}

fn wire_value(c: &mut Cursor<'_>) -> f32 {
    const SPECIAL: [u32; 16] = [
        0x7fc0_0000, // NaN
        0xffc0_0000, // -NaN
        0x7f80_0000, // +inf
        0xff80_0000, // -inf
        0x0000_0000, // +0
        0x8000_0000, // -0
        0x0000_0001, // smallest subnormal
        0x007f_ffff, // largest subnormal
        0x3506_37bd, // just below half a ppm
        0x3506_37be, // just above half a ppm
        0x3f7f_fff7, // 999 999.46 ppm
        0x3f7f_fff8, // 999 999.52 ppm
        0x3f7f_ffff, // largest below 1
        0x3f80_0000, // 1
        0x3f80_0001, // just above 1
        0x3c00_0000, // 2^-7, exactly 7812.5 ppm
    ];
    match c.u8() % 4 {
        0 => f32::from_bits(SPECIAL[usize::from(c.u8() % 16)]),
        1 => f32::from_bits(c.u32()),
        2 => Signal::from_ppm(c.u32() % 1_000_001).to_f32(),
        _ => f32::from_bits(c.u32() % 0x3f80_0002), // (0, 1] mostly
    }
}

/// Decodes `data` into a configuration and a sequence of operations, drives the machine and
/// the reference side by side, and reports the first disagreement.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);

    // Server configuration: mostly sound small triggers, sometimes anything at all.
    let (tf, tr, budget) = if c.u8() % 4 == 0 {
        let (tf, tr) = (trigger(&mut c), trigger(&mut c));
        let budget = if c.bool() {
            Some((write_buffer_size(&mut c), trigger(&mut c)))
        } else {
            None
        };
        (tf, tr, budget)
    } else {
        let tf = 1 + u32::from(c.u8() % 24);
        let tr = tf + 1 + u32::from(c.u8() % 24);
        let budget = if c.bool() {
            Some((
                write_buffer_size(&mut c).max(1),
                1 + u32::from(c.u8()) % (tr - 1),
            ))
        } else {
            None
        };
        (tf, tr, budget)
    };
    let mut builder = PressureConfig::builder()
        .l0_trigger(tf)
        .l0_slowdown_writes_trigger(tr);
    if let Some((size, count)) = budget {
        builder = builder.flush_budget(size, count);
    }
    let bad = bad_server_options(tf, tr, budget);
    let cfg = match (builder.build(), bad.iter().any(Option::is_some)) {
        (Ok(cfg), false) => cfg,
        (Err(e), true) if bad.contains(&Some(e.option())) => PressureConfig::default(),
        (got, _) => {
            return Err(format!(
                "server config Tf {tf} Tr {tr} budget {budget:?}: got {got:?}, bad options {bad:?}"
            ));
        }
    };
    let mut server = ServerPressure::new(cfg);
    let (rtf, rtr, rbudget) = if bad.iter().any(Option::is_some) {
        (8, 20, None) // the default: Fluss as landed
    } else {
        (tf, tr, budget)
    };
    let mut reference = RefServer {
        tf: u128::from(rtf),
        tr: u128::from(rtr),
        budget: rbudget.map(|(s, n)| (u128::from(s), u128::from(n))),
        l0: 0,
        pending: 0,
        latched: false,
    };

    // Client curve, valid or not.
    let k = u32::from(c.u8() % 6);
    let max = max_throttle(&mut c);
    let curve_ok = (1..=4).contains(&k)
        && max.as_nanos() % 1_000_000 == 0
        && max.as_millis() <= u128::from(u32::MAX);
    let curve = match (
        ThrottleCurve::builder()
            .exponent(k)
            .max_throttle(max)
            .build(),
        curve_ok,
    ) {
        (Ok(curve), true) => curve,
        (Err(_), false) => ThrottleCurve::default(),
        (got, _) => return Err(format!("curve k {k} max {max:?}: got {got:?}")),
    };
    let (rk, rmax) = if curve_ok {
        (k, u64::try_from(max.as_millis()).unwrap_or(u64::MAX))
    } else {
        (2, 3_000) // the default: Fluss as landed
    };
    if curve.exponent() != rk || curve.max_throttle() != Duration::from_millis(rmax) {
        return Err(format!("curve {curve:?}, expected k {rk} max {rmax} ms"));
    }

    let mut step = 0u32;
    while !c.is_empty() {
        step = step.saturating_add(1);
        let Some(op) = c.select(7) else {
            continue;
        };
        match op {
            0 | 1 => {
                let l0 = match c.u8() % 8 {
                    0 => u64::MAX,
                    1 => c.u64(),
                    2 => u64::from(rtf).saturating_sub(1),
                    3 => u64::from(rtr).saturating_sub(1),
                    4 => u64::from(rtr),
                    _ => u64::from(c.u8() % 40),
                };
                server.handle_l0(l0);
                reference.l0 = u128::from(l0);
                // The ramp never falls as L0 grows, and a rejection stays one.
                let mut next = server.clone();
                next.handle_l0(l0.saturating_add(1));
                if next.pressure().ppm() < server.pressure().ppm()
                    || (server.decide().is_reject() && !next.decide().is_reject())
                {
                    return Err(format!(
                        "step {step}: not monotone from L0 {l0} ({server:?})"
                    ));
                }
            }
            2 => {
                let size = rbudget.map_or(64 << 20, |(s, _)| s).max(1);
                let bytes = match c.u8() % 6 {
                    0 => 0,
                    1 => u64::MAX,
                    2 => c.u64(),
                    3 => size.saturating_mul(u64::from(c.u8() % 24)),
                    4 => size
                        .saturating_mul(u64::from(c.u8() % 24))
                        .saturating_add(1),
                    _ => size
                        .saturating_mul(u64::from(c.u8() % 24))
                        .saturating_sub(1),
                };
                server.handle_pending_bytes(bytes);
                reference.pending = u128::from(bytes);
            }
            3 => {
                server.handle_write_rejected();
                reference.latched = true;
            }
            4 => {
                server.handle_flush_completed();
                reference.latched = false;
            }
            5 => {
                let x = wire_value(&mut c);
                let signal = Signal::from_f32(x);
                let want = ref_from_f32_ppm(x);
                if ref_signal_ppm(signal) != want || !is_normal(signal) {
                    return Err(format!(
                        "step {step}: from_f32({x:e}) = {signal:?}, want {want} ppm"
                    ));
                }
                check_curve(&curve, rk, rmax, signal, step)?;
            }
            _ => {
                // A raw payload, normalised or not.
                let signal = Signal::Pressure(c.u32());
                check_curve(&curve, rk, rmax, signal, step)?;
            }
        }

        let got = server.decide();
        let want = reference.verdict();
        if verdict_of(got) != want {
            return Err(format!(
                "step {step} op {op}: decide {got:?}, reference {want:?} ({server:?})"
            ));
        }
        let gauge = server.pressure();
        if ref_signal_ppm(gauge) != reference.gauge_ppm() || !is_normal(gauge) {
            return Err(format!(
                "step {step}: pressure {gauge:?}, reference {} ppm ({server:?})",
                reference.gauge_ppm()
            ));
        }
        if server.is_latched() != reference.latched {
            return Err(format!("step {step}: latch {}", server.is_latched()));
        }
        let signal = got.signal();
        let expected_signal = match want {
            Verdict::Accept(p) if p >= 1_000_000 => {
                return Err(format!("step {step}: accepted with full pressure {p}"));
            }
            Verdict::Accept(p) => p,
            _ => 1_000_000,
        };
        if ref_signal_ppm(signal) != expected_signal || !is_normal(signal) {
            return Err(format!("step {step}: {got:?} signals {signal:?}"));
        }
        // Server → wire → client is lossless, and the client delay is the reference's.
        if Signal::from_f32(signal.to_f32()) != signal {
            return Err(format!("step {step}: {signal:?} does not survive the wire"));
        }
        let delay = curve.delay(signal);
        let ref_delay = Duration::from_millis(ref_delay_ms(rk, rmax, expected_signal));
        if delay != ref_delay {
            return Err(format!(
                "step {step}: delay {delay:?} for {signal:?}, reference {ref_delay:?}"
            ));
        }
    }
    Ok(())
}

/// The curve at `signal` against the reference, plus its shape around it: zero at clear, the
/// ceiling at full, never above it, and monotone between neighbouring ppm values.
fn check_curve(
    curve: &ThrottleCurve,
    k: u32,
    max_ms: u64,
    signal: Signal,
    step: u32,
) -> Result<(), Divergence> {
    let ppm = ref_signal_ppm(signal);
    let got = curve.delay(signal);
    let want = Duration::from_millis(ref_delay_ms(k, max_ms, ppm));
    if got != want {
        return Err(format!(
            "step {step}: delay({signal:?}) = {got:?}, reference {want:?}"
        ));
    }
    let ceiling = Duration::from_millis(max_ms);
    let below = curve.delay(Signal::Pressure(ppm.saturating_sub(1)));
    let above = curve.delay(Signal::Pressure(ppm.saturating_add(1)));
    if got > ceiling || below > got || got > above {
        return Err(format!(
            "step {step}: curve not monotone/bounded at {ppm} ppm: {below:?} {got:?} {above:?}"
        ));
    }
    if curve.delay(Signal::Clear) != Duration::ZERO || curve.delay(Signal::Full) != ceiling {
        return Err(format!("step {step}: curve ends wrong"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_short_inputs_pass() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&[0xff; 64]), Ok(()));
        assert_eq!(check(&[0x00; 64]), Ok(()));
    }

    #[test]
    fn reference_curve_reproduces_upstreams_810ms() {
        assert_eq!(ref_delay_ms(2, 1_000, 900_000), 810);
        assert_eq!(ref_delay_ms(4, u64::from(u32::MAX), 999_999), 4_294_950_115);
    }
}
