//! Model check of [`crate::backoff`]: random configs, then random `next_delay` / `reset` /
//! `delay_for` calls, each compared with a naive reference.
//!
//! The reference shares no code with the machine: it keeps its own table of preset values
//! and bounds, decides validity from the rules as written, recomputes every base delay by
//! iterating the recurrence from attempt 0 (a plain loop, stopped at a fixed point or after
//! 5000 steps; it never uses the machine's precomputed settle attempt), and checks
//! every delay against its strategy's bounds, `max`, `floor`, the resolution grid, the budget,
//! and that the additive offset stays constant within a sequence.

use alloc::format;
use alloc::string::String;
use core::time::Duration;

use super::{Cursor, Divergence};
use crate::backoff::{Backoff, BackoffConfig, Jitter};
use crate::rng::SplitMix64;

/// Most growth steps the reference walks; above the documented limit of 4096 so a config the
/// machine accepts but that never settles is reported rather than cut short.
const REF_STEPS: u32 = 5_000;
/// The documented ramp limit (`MAX_RAMP_ATTEMPTS`), restated from the docs.
const RAMP_LIMIT: u32 = 4_096;
const MS: u64 = 1_000_000;
const FLUSS_MAX: u64 = 2_147_483_647 * MS;
const MAX_OPS: usize = 400;

/// The reference's view of a jitter strategy (ns / ppm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefJitter {
    None,
    Proportional(u32),
    /// Range in ns, and the `Duration` actually handed to the builder.
    Additive(u64, Duration),
    Full,
    Equal,
    Decorrelated,
}

impl RefJitter {
    fn to_machine(self) -> Jitter {
        match self {
            RefJitter::None => Jitter::None,
            RefJitter::Proportional(ppm) => Jitter::Proportional { ppm },
            RefJitter::Additive(_, range) => Jitter::Additive { range },
            RefJitter::Full => Jitter::Full,
            RefJitter::Equal => Jitter::Equal,
            RefJitter::Decorrelated => Jitter::Decorrelated,
        }
    }
}

/// A config as the reference understands it, all spans in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spec {
    preset: u8,
    initial: u64,
    max: u64,
    num: u32,
    den: u32,
    jitter: RefJitter,
    floor: u64,
    res: u64,
    budget: Option<u64>,
    /// The preset's bounds: smallest initial, largest max.
    initial_min: u64,
    max_max: u64,
}

/// The presets, transcribed from DESIGN §3.1 (not from the machine).
fn preset_spec(preset: u8) -> Spec {
    let twenty = RefJitter::Proportional(200_000);
    let base = Spec {
        preset,
        initial: 1_000 * MS,
        max: 10_000 * MS,
        num: 2,
        den: 1,
        jitter: twenty,
        floor: 0,
        res: MS,
        budget: None,
        initial_min: 0,
        max_max: u64::MAX,
    };
    match preset {
        1 => Spec {
            floor: MS,
            initial_min: MS,
            max_max: FLUSS_MAX,
            ..base
        },
        2 => Spec {
            initial: 100 * MS,
            max: 1_000 * MS,
            max_max: FLUSS_MAX,
            ..base
        },
        3 => Spec {
            initial: 100 * MS,
            max: 1_000 * MS,
            ..base
        },
        4 => Spec {
            max: 120_000 * MS,
            num: 16,
            den: 10,
            ..base
        },
        5 => Spec {
            initial: 500 * MS,
            jitter: RefJitter::Additive(500 * MS, Duration::from_millis(500)),
            ..base
        },
        _ => base,
    }
}

fn machine_preset(preset: u8) -> BackoffConfig {
    match preset {
        1 => BackoffConfig::fluss_disk_write_locked(),
        2 => BackoffConfig::fluss_retriable_write(),
        3 => BackoffConfig::kafka_retry(),
        4 => BackoffConfig::grpc_connection(),
        5 => BackoffConfig::gobblin_throttling_client(),
        _ => BackoffConfig::builder().build().unwrap_or_default(),
    }
}

/// A span: ns for the reference, the `Duration` handed to the machine (which may exceed u64 ns).
fn span(c: &mut Cursor<'_>) -> (u64, Duration) {
    let ns = match c.u8() % 10 {
        0 => 0,
        1 => return (u64::MAX, Duration::MAX),
        2 => u64::MAX,
        3 => c.u64(),
        4 => u64::from(c.u16()).saturating_mul(MS),
        5 => u64::from(c.u16()),
        6 => (MS - 1) + u64::from(c.u8() % 3),
        7 => (FLUSS_MAX - 1) + u64::from(c.u8() % 3),
        _ => u64::from(c.u32() % 5_000_000).saturating_mul(1_000),
    };
    (ns, Duration::from_nanos(ns))
}

fn decode_spec(c: &mut Cursor<'_>) -> (Spec, BackoffConfig, Result<BackoffConfig, String>) {
    let preset = c.below(6);
    let mut s = preset_spec(preset);
    let start = machine_preset(preset);
    let mut b = if preset == 0 {
        BackoffConfig::builder()
    } else {
        start.to_builder()
    };
    // Few overrides per config, so most configs are valid.
    let mask = c.u8() & c.u8();
    if mask & 1 != 0 {
        let (ns, d) = span(c);
        s.initial = ns;
        b = b.initial(d);
    }
    if mask & 2 != 0 {
        let (ns, d) = span(c);
        s.max = ns;
        b = b.max(d);
    }
    if mask & 4 != 0 {
        let (num, den) = match c.u8() % 6 {
            0 => (2, 1),
            1 => (16, 10),
            2 => (u32::from(c.u8()), u32::from(c.u8())),
            3 => (c.u32(), c.u32()),
            4 => {
                let den = u32::from(c.u16());
                (den.saturating_add(u32::from(c.u8() % 4)), den)
            }
            _ => (u32::MAX, 1),
        };
        s.num = num;
        s.den = den;
        b = b.multiplier(num, den);
    }
    if mask & 8 != 0 {
        s.jitter = match c.u8() % 6 {
            0 => RefJitter::None,
            1 => RefJitter::Proportional(match c.u8() % 4 {
                0 => 200_000,
                1 => 1_000_000,
                2 => 1_000_001,
                _ => c.u32(),
            }),
            2 => {
                let (ns, d) = span(c);
                RefJitter::Additive(ns, d)
            }
            3 => RefJitter::Full,
            4 => RefJitter::Equal,
            _ => RefJitter::Decorrelated,
        };
        b = b.jitter(s.jitter.to_machine());
    }
    if mask & 16 != 0 {
        let res = match c.u8() % 5 {
            0 => 1,
            1 => MS,
            2 => 0,
            3 => u64::from(c.u16()),
            _ => span(c).0,
        };
        s.res = res;
        b = b.resolution(Duration::from_nanos(res));
    }
    if mask & 32 != 0 {
        let (ns, d) = if c.bool() {
            // A multiple of the resolution, the common valid case.
            let ns = s.res.saturating_mul(u64::from(c.u8() % 8));
            (ns, Duration::from_nanos(ns))
        } else {
            span(c)
        };
        s.floor = ns;
        b = b.floor(d);
    }
    if mask & 64 != 0 {
        s.budget = if c.bool() { None } else { Some(span(c)) }.map(|(ns, _)| ns);
        let d = s.budget.map(Duration::from_nanos);
        b = b.total_budget(d);
    }
    let built = b.build().map_err(|e| format!("{e}"));
    (s, start, built)
}

/// `min(cap, ⌊d·num/den⌋)` written out for the reference.
fn ref_step(s: &Spec, d: u64) -> u64 {
    if s.den == 0 {
        return d;
    }
    let next = u128::from(d) * u128::from(s.num) / u128::from(s.den);
    if next > u128::from(s.max) {
        s.max
    } else {
        // next ≤ max ≤ u64::MAX
        u64::try_from(next).unwrap_or(s.max)
    }
}

/// Growth steps until the base stops changing, or `None` past `REF_STEPS`.
fn ref_ramp_len(s: &Spec) -> Option<u32> {
    let mut d = s.initial;
    let mut steps = 0;
    loop {
        let next = ref_step(s, d);
        if next == d {
            return Some(steps);
        }
        if steps >= REF_STEPS {
            return None;
        }
        steps += 1;
        d = next;
    }
}

fn ref_valid(s: &Spec) -> bool {
    let jitter_ok = match s.jitter {
        RefJitter::Proportional(ppm) => ppm <= 1_000_000,
        _ => true,
    };
    s.res >= 1
        && s.initial >= s.initial_min
        && s.max <= s.max_max
        && s.initial <= s.max
        && s.den > 0
        && s.num >= s.den
        && jitter_ok
        && s.floor <= s.max
        && s.floor.is_multiple_of(s.res)
        && matches!(ref_ramp_len(s), Some(n) if n <= RAMP_LIMIT)
}

/// Base of `attempt`, iterating from `initial` every time.
fn ref_base(s: &Spec, attempt: u32) -> Result<u64, Divergence> {
    let mut d = s.initial;
    let mut i = 0u32;
    while i < attempt {
        let next = ref_step(s, d);
        if next == d {
            break;
        }
        if i >= REF_STEPS {
            return Err(format!(
                "accepted {s:?}, whose base still grows after {i} steps"
            ));
        }
        d = next;
        i += 1;
    }
    Ok(d)
}

fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    if c == 0 {
        return a;
    }
    let q = u128::from(a) * u128::from(b) / u128::from(c);
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// Clamp to max, lift to floor, truncate to the grid.
fn ref_finish(s: &Spec, raw: u64) -> u64 {
    let v = raw.min(s.max).max(s.floor);
    if s.res == 0 { v } else { v - v % s.res }
}

/// `[lo, hi]` of the final delay for `base`, `prev` and a known or unknown additive offset.
fn ref_bounds(s: &Spec, base: u64, prev: u64, offset: Option<u64>) -> (u64, u64) {
    if s.initial == 0 {
        return (0, 0);
    }
    let (lo, hi) = match s.jitter {
        RefJitter::None => (base, base),
        RefJitter::Proportional(_) if s.initial == s.max => (base, base),
        RefJitter::Proportional(ppm) => {
            let ppm = u64::from(ppm);
            let top = if ppm == 0 {
                1_000_000
            } else {
                1_000_000 + ppm - 1
            };
            (
                mul_div(base, 1_000_000 - ppm, 1_000_000),
                mul_div(base, top, 1_000_000),
            )
        }
        RefJitter::Additive(range, _) => {
            let scaled = |off: u64| mul_div(base, s.initial.saturating_add(off), s.initial);
            match offset {
                Some(off) => (scaled(off), scaled(off)),
                None => (scaled(0), scaled(range.saturating_sub(1))),
            }
        }
        RefJitter::Full => (0, base),
        RefJitter::Equal => (base / 2, base),
        RefJitter::Decorrelated => (s.initial, s.initial.max(prev.saturating_mul(3))),
    };
    (ref_finish(s, lo), ref_finish(s, hi))
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Invariants every delay keeps, whatever the strategy.
fn check_delay(
    s: &Spec,
    what: &str,
    d: u64,
    base: u64,
    bounds: (u64, u64),
) -> Result<(), Divergence> {
    if s.initial == 0 {
        return if d == 0 {
            Ok(())
        } else {
            Err(format!("{what}: disabled backoff gave {d} ns"))
        };
    }
    if d > s.max {
        return Err(format!("{what}: {d} ns above max {} ns", s.max));
    }
    if d < s.floor {
        return Err(format!("{what}: {d} ns below floor {} ns", s.floor));
    }
    if !d.is_multiple_of(s.res) {
        return Err(format!("{what}: {d} ns not a multiple of {} ns", s.res));
    }
    if d < bounds.0 || d > bounds.1 {
        return Err(format!(
            "{what}: {d} ns outside [{}, {}] (base {base} ns, {:?})",
            bounds.0, bounds.1, s.jitter
        ));
    }
    let never_earlier = matches!(s.jitter, RefJitter::None | RefJitter::Additive(..));
    if never_earlier && d < ref_finish(s, base) {
        return Err(format!(
            "{what}: {d} ns earlier than the unjittered {base} ns"
        ));
    }
    Ok(())
}

/// The reference sequence.
#[derive(Debug, Default)]
struct RefSeq {
    attempt: u32,
    prev: u64,
    offset: Option<u64>,
    spent: u64,
    exhausted: bool,
}

impl RefSeq {
    fn prev_for(&self, s: &Spec, attempt: u32) -> Result<u64, Divergence> {
        if attempt == self.attempt && attempt > 0 {
            Ok(self.prev)
        } else {
            stand_in(s, attempt)
        }
    }
}

/// Outside a sequence, decorrelated jitter uses the previous attempt's base (initial at 0).
fn stand_in(s: &Spec, attempt: u32) -> Result<u64, Divergence> {
    match attempt.checked_sub(1) {
        None => Ok(s.initial),
        Some(a) => ref_base(s, a),
    }
}

fn check_getters(s: &Spec, cfg: &BackoffConfig) -> Result<(), Divergence> {
    let got = (
        ns(cfg.initial()),
        ns(cfg.max()),
        cfg.multiplier(),
        cfg.jitter(),
        ns(cfg.floor()),
        ns(cfg.resolution()),
        cfg.total_budget().map(ns),
        cfg.is_disabled(),
    );
    let want = (
        s.initial,
        s.max,
        (s.num, s.den),
        s.jitter.to_machine(),
        s.floor,
        s.res,
        s.budget,
        s.initial == 0,
    );
    if got == want {
        Ok(())
    } else {
        Err(format!("config reads back {got:?}, expected {want:?}"))
    }
}

/// Drives `next_delay` on the machine and checks it against the reference.
fn step_next(
    s: &Spec,
    cfg: &BackoffConfig,
    m: &mut Backoff,
    r: &mut RefSeq,
    rng: &mut SplitMix64,
) -> Result<Option<u64>, Divergence> {
    let got = m.next_delay(cfg, rng).map(ns);
    let base = ref_base(s, r.attempt)?;
    let prev = if r.attempt == 0 { s.initial } else { r.prev };
    let bounds = ref_bounds(s, base, prev, r.offset);
    let left = s.budget.map(|b| b.saturating_sub(r.spent));
    match got {
        None => {
            let refusable = r.exhausted || left.is_some_and(|left| bounds.1 > left);
            if !refusable {
                return Err(format!(
                    "attempt {}: refused, but every delay in [{}, {}] fits the {left:?} ns left",
                    r.attempt, bounds.0, bounds.1
                ));
            }
            r.exhausted = true;
        }
        Some(d) => {
            if r.exhausted {
                return Err(format!("delay {d} ns after the budget was exhausted"));
            }
            check_delay(s, "next_delay", d, base, bounds)?;
            if let Some(left) = left
                && d > left
            {
                return Err(format!("delay {d} ns exceeds the {left} ns left"));
            }
            let additive = matches!(s.jitter, RefJitter::Additive(..)) && s.initial != 0;
            let off = m.offset().map(ns);
            match (additive, r.offset, off) {
                (false, _, None) => {}
                (true, None, Some(o)) => {
                    let range = match s.jitter {
                        RefJitter::Additive(range, _) => range,
                        _ => 0,
                    };
                    if o >= range.max(1) {
                        return Err(format!("offset {o} ns outside [0, {range})"));
                    }
                    // Now that the offset is known, the delay is exact.
                    let exact = ref_bounds(s, base, prev, Some(o));
                    check_delay(s, "first additive delay", d, base, exact)?;
                    r.offset = Some(o);
                }
                (true, Some(kept), Some(o)) if kept == o => {}
                (_, kept, o) => {
                    return Err(format!(
                        "attempt {}: offset {o:?}, expected {kept:?} (additive: {additive})",
                        r.attempt
                    ));
                }
            }
            r.attempt = r.attempt.saturating_add(1);
            r.prev = d;
            r.spent = r.spent.saturating_add(d);
        }
    }
    Ok(got)
}

fn check_state(s: &Spec, cfg: &BackoffConfig, m: &Backoff, r: &RefSeq) -> Result<(), Divergence> {
    let got = (
        m.attempt(),
        ns(m.spent()),
        m.is_exhausted(),
        m.offset().map(ns),
        m.remaining_budget(cfg).map(ns),
    );
    let want = (
        r.attempt,
        r.spent,
        r.exhausted,
        r.offset,
        s.budget.map(|b| b.saturating_sub(r.spent)),
    );
    if got == want {
        Ok(())
    } else {
        Err(format!("state {got:?}, reference {want:?}"))
    }
}

/// Decodes a config and a sequence of calls from `data` and checks the backoff against the
/// reference after every call.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    let (mut s, start, built) = decode_spec(&mut c);
    let cfg = match (built, ref_valid(&s)) {
        (Ok(cfg), true) => cfg,
        (Err(_), false) => {
            // Refused as it should be: carry on with the unmodified preset.
            s = preset_spec(s.preset);
            start
        }
        (Ok(cfg), false) => return Err(format!("accepted invalid {s:?} as {cfg:?}")),
        (Err(e), true) => return Err(format!("refused valid {s:?}: {e}")),
    };
    check_getters(&s, &cfg)?;
    if !ref_valid(&s) {
        return Err(format!("preset {} breaks its own rules: {s:?}", s.preset));
    }

    let mut rng = SplitMix64::new(c.u64());
    let mut m = Backoff::new();
    let mut r = RefSeq::default();
    let mut ops = 0;
    while !c.is_empty() && ops < MAX_OPS {
        ops += 1;
        match c.u8() % 10 {
            0..=4 => {
                step_next(&s, &cfg, &mut m, &mut r, &mut rng)?;
            }
            5 => {
                m.reset();
                r = RefSeq::default();
            }
            6 => {
                let a = c.small_or_extreme_u32();
                let d = ns(cfg.delay_for(a, &mut rng));
                let base = ref_base(&s, a)?;
                let bounds = ref_bounds(&s, base, stand_in(&s, a)?, None);
                check_delay(&s, "config delay_for", d, base, bounds)?;
            }
            7 => {
                let a = if c.bool() {
                    m.attempt()
                } else {
                    c.small_or_extreme_u32()
                };
                let d = ns(m.delay_for(&cfg, a, &mut rng));
                let base = ref_base(&s, a)?;
                let bounds = ref_bounds(&s, base, r.prev_for(&s, a)?, r.offset);
                check_delay(&s, "sequence delay_for", d, base, bounds)?;
            }
            8 => {
                // The query predicts the next delay exactly, given the same RNG state.
                let predicted = ns(m.delay_for(&cfg, m.attempt(), &mut rng.clone()));
                let exhausted = r.exhausted;
                let left = s.budget.map(|b| b.saturating_sub(r.spent));
                match step_next(&s, &cfg, &mut m, &mut r, &mut rng)? {
                    Some(d) if d != predicted => {
                        return Err(format!("delay_for predicted {predicted} ns, got {d} ns"));
                    }
                    None if !exhausted && left.is_none_or(|left| predicted <= left) => {
                        return Err(format!(
                            "refused a predicted {predicted} ns within {left:?}"
                        ));
                    }
                    _ => {}
                }
            }
            _ => rng = SplitMix64::new(c.u64()),
        }
        check_state(&s, &cfg, &m, &r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_survives_a_long_run_of_next_delay() {
        for preset in 0..6u8 {
            let mut data = alloc::vec![preset, 0, 0];
            data.extend_from_slice(&[7; 8]);
            data.extend(core::iter::repeat_n(0, 300));
            assert_eq!(check(&data), Ok(()), "preset {preset}");
        }
    }

    #[test]
    fn reference_presets_match_the_machine() {
        for preset in 0..6u8 {
            let s = preset_spec(preset);
            assert!(ref_valid(&s), "preset {preset}");
            assert_eq!(check_getters(&s, &machine_preset(preset)), Ok(()));
        }
    }
}
