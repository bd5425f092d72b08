//! Model check of [`crate::backoff`]: random configs, then random `next_delay` / `reset` /
//! `delay_for` calls, each compared with a naive reference.
//!
//! The reference shares no code with the machine: it keeps its own table of preset values
//! and bounds, decides validity from the rules as written, recomputes every base delay by
//! iterating the recurrence from attempt 0 (a plain loop from `initial`, or for additive
//! jitter from the jittered start `initial + offset` as `docs/design.md` §3.1 defines it; stopped
//! at a fixed point, never using the machine's precomputed settle attempt), and draws from its own
//! copy of the machine's identically seeded [`SplitMix64`], turning the same raw 64-bit words into
//! uniform values with its own code. Every delay is therefore compared **exactly**, and the two
//! generators must be in the same state after every call (a strategy that draws more, less or
//! differently than its definition diverges even when a delay happens to match). On top of that
//! each delay is checked against `max`, `floor`, the resolution grid and the unjittered delay, and
//! the sequence state (attempt, spent budget, offset, which limit refused) after every call.
//! The limits (`max_attempts`, the soft `max_wait`) are checked as Gobblin's
//! `ExponentialBackoff.awaitNextRetry` writes them, before anything is drawn.

use alloc::format;
use alloc::string::String;
use core::time::Duration;

use super::{Cursor, Divergence};
use crate::backoff::{Backoff, BackoffConfig, Exhausted, Jitter, JitterOrder};
use crate::rng::{Rng, SplitMix64};

/// Most growth steps the reference walks when deciding validity; above the documented limit of
/// 4096 so a ramp that settles just past it is measured, not cut short.
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
    /// `base + U[0, ppm)·base/10⁶`, drawn every delay (backon, tower).
    PerDelay(u32),
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
            RefJitter::PerDelay(ppm) => Jitter::PerDelay { ppm },
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
    /// Gobblin's `maxRetries` and `maxWait` (ns).
    max_attempts: Option<u32>,
    max_wait: Option<u64>,
    /// The preset's bounds: smallest initial, largest max.
    initial_min: u64,
    max_max: u64,
    /// `max` clamps only the base, not the jittered delay (gRFC A6, gRPC connection backoff).
    cap_then_jitter: bool,
    /// The first delay of a sequence is `initial`, undrawn.
    first_unjittered: bool,
}

/// The presets, transcribed from `docs/design.md` §3.1 (not from the machine).
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
        max_attempts: None,
        max_wait: None,
        initial_min: 0,
        max_max: u64::MAX,
        cap_then_jitter: false,
        first_unjittered: false,
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
        // grpc/grpc doc/connection-backoff.md: the first wait is INITIAL_BACKOFF exactly,
        // later ones min(cur·1.6, 120 s) ± 20 %, jittered after the cap (its
        // MIN_CONNECT_TIMEOUT is the connection table's).
        4 => Spec {
            max: 120_000 * MS,
            num: 16,
            den: 10,
            cap_then_jitter: true,
            first_unjittered: true,
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
    // An unassigned preset value is a skipped override: the plain builder, like preset 0.
    let preset = c.select(6).unwrap_or(0);
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
        // An unassigned strategy skips the override: the preset's jitter stays. An assigned
        // selector indexes `Jitter::ALL`, and the match is exhaustive so that a new strategy
        // cannot be left out of the reference.
        let n = u8::try_from(Jitter::ALL.len()).unwrap_or(u8::MAX);
        let jitter = match c.select(n).and_then(|i| Jitter::ALL.get(usize::from(i))) {
            None => None,
            Some(Jitter::None) => Some(RefJitter::None),
            Some(Jitter::Proportional { .. }) => Some(RefJitter::Proportional(match c.u8() % 4 {
                0 => 200_000,
                1 => 1_000_000,
                2 => 1_000_001,
                _ => c.u32(),
            })),
            Some(Jitter::Additive { .. }) => {
                let (ns, d) = span(c);
                Some(RefJitter::Additive(ns, d))
            }
            Some(Jitter::Full) => Some(RefJitter::Full),
            Some(Jitter::Equal) => Some(RefJitter::Equal),
            Some(Jitter::Decorrelated) => Some(RefJitter::Decorrelated),
            Some(Jitter::PerDelay { .. }) => Some(RefJitter::PerDelay(match c.u8() % 4 {
                0 => 1_000_000,
                1 => 100_000_000,
                2 => 100_000_001,
                _ => c.u32(),
            })),
        };
        if let Some(jitter) = jitter {
            s.jitter = jitter;
            b = b.jitter(jitter.to_machine());
        }
    }
    if mask & 16 != 0 {
        let res = match c.u8() % 6 {
            // 1 ns twice as often: a fine grid shows 1 ns slips that truncation would hide.
            0 | 5 => 1,
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
    // The bit no option used before the limits existed: only inputs that set it read more.
    if mask & 128 != 0 {
        s.max_attempts = match c.u8() % 4 {
            0 => None,
            1 => Some(0),
            2 => Some(c.small_or_extreme_u32()),
            _ => Some(u32::from(c.u8() % 8)),
        };
        b = b.max_attempts(s.max_attempts);
        s.max_wait = match c.u8() % 3 {
            0 => None,
            1 => Some(span(c).0),
            _ => Some(MS.saturating_mul(u64::from(c.u16()))),
        };
        b = b.max_wait(s.max_wait.map(Duration::from_nanos));
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

/// Growth steps from `start` until the base stops changing, or `None` past `REF_STEPS`.
fn ref_ramp_len(s: &Spec, start: u64) -> Option<u32> {
    let mut d = start;
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

/// With additive jitter, the ramp from every start `initial + off` (`off < range`) must settle
/// within the limit too. Below `max` a start either never moves or climbs to `max`, whether
/// it moves is monotone in the start, and a lower start never overtakes a higher one; so the
/// smallest start that moves, found here by bisection, has the longest ramp.
fn ref_additive_ok(s: &Spec) -> bool {
    let range = match s.jitter {
        RefJitter::Additive(range, _) => range,
        RefJitter::None
        | RefJitter::Proportional(_)
        | RefJitter::PerDelay(_)
        | RefJitter::Full
        | RefJitter::Equal
        | RefJitter::Decorrelated => return true,
    };
    if s.initial == 0 || range == 0 || s.initial >= s.max {
        return true;
    }
    let moves = |d: u64| ref_step(s, d) > d;
    // Starts at or above max are fixed at max.
    let highest = s.initial.saturating_add(range - 1).min(s.max - 1);
    if !moves(highest) {
        return true;
    }
    let (mut lo, mut hi) = (s.initial, highest);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if moves(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    matches!(ref_ramp_len(s, hi), Some(n) if n <= RAMP_LIMIT)
}

fn ref_valid(s: &Spec) -> bool {
    let jitter_ok = match s.jitter {
        RefJitter::Proportional(ppm) => ppm <= 1_000_000,
        // tower refuses a jitter above 100.
        RefJitter::PerDelay(ppm) => ppm <= 100_000_000,
        RefJitter::None
        | RefJitter::Additive(..)
        | RefJitter::Full
        | RefJitter::Equal
        | RefJitter::Decorrelated => true,
    };
    // Cap-then-jitter is defined for draws around the capped base; the additive start and
    // decorrelated jitter cap inside their own recurrence.
    let order_ok = !s.cap_then_jitter
        || match s.jitter {
            RefJitter::Additive(..) | RefJitter::Decorrelated => false,
            RefJitter::None
            | RefJitter::Proportional(_)
            | RefJitter::PerDelay(_)
            | RefJitter::Full
            | RefJitter::Equal => true,
        };
    // An additive offset jitters the first delay by definition.
    let first_ok = !s.first_unjittered || !matches!(s.jitter, RefJitter::Additive(..));
    s.res >= 1
        && s.initial >= s.initial_min
        && s.max <= s.max_max
        && s.initial <= s.max
        && s.den > 0
        && s.num >= s.den
        && jitter_ok
        && order_ok
        && first_ok
        && s.floor <= s.max
        && s.floor.checked_rem(s.res).map_or(s.floor == 0, |r| r == 0)
        && (s.initial == 0 || s.res <= s.max)
        && matches!(ref_ramp_len(s, s.initial), Some(n) if n <= RAMP_LIMIT)
        && ref_additive_ok(s)
}

/// Base of `attempt` for a ramp starting at `start`, iterating from it every time. A ramp
/// still growing after the documented limit means the config should have been refused.
fn ref_base_from(s: &Spec, start: u64, attempt: u32) -> Result<u64, Divergence> {
    let mut d = start;
    let mut i = 0u32;
    while i < attempt {
        let next = ref_step(s, d);
        if next == d {
            break;
        }
        if i >= RAMP_LIMIT {
            return Err(format!(
                "accepted {s:?}, whose base from {start} ns still grows after {i} steps"
            ));
        }
        d = next;
        i += 1;
    }
    Ok(d)
}

/// Unjittered base of `attempt`.
fn ref_base(s: &Spec, attempt: u32) -> Result<u64, Divergence> {
    ref_base_from(s, s.initial, attempt)
}

fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    if c == 0 {
        return a;
    }
    let q = u128::from(a) * u128::from(b) / u128::from(c);
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// Uniform in `[0, n)` from raw 64-bit words, written out here rather than borrowed from
/// `crate::rng`: Lemire's multiply-shift keeps the high word of `word·n` and rejects the
/// `2⁶⁴ mod n` low words that would bias it. Consumes nothing for `n = 0` (an empty range).
fn ref_below(rng: &mut SplitMix64, n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let biased = u64::try_from((1u128 << 64) % u128::from(n)).unwrap_or(0);
    loop {
        let wide = u128::from(rng.next_u64()) * u128::from(n);
        let low = u64::try_from(wide & u128::from(u64::MAX)).unwrap_or(0);
        if low >= biased {
            return u64::try_from(wide >> 64).unwrap_or(0);
        }
    }
}

/// Uniform in `[lo, hi]`; `lo` (nothing consumed) for an empty or one-point range, one raw
/// word for the whole `u64` range.
fn ref_between(rng: &mut SplitMix64, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        lo
    } else if hi - lo == u64::MAX {
        rng.next_u64()
    } else {
        lo + ref_below(rng, hi - lo + 1)
    }
}

/// Clamp to max (jitter-then-cap only), lift to floor, truncate to the grid but never below
/// one grid step.
fn ref_finish(s: &Spec, raw: u64) -> u64 {
    let capped = if s.cap_then_jitter {
        raw
    } else {
        raw.min(s.max)
    };
    let v = capped.max(s.floor);
    let on_grid = if s.res == 0 { v } else { v - v % s.res };
    on_grid.max(s.res)
}

/// The exact delay of `attempt` with previous delay `prev`, drawing from `rng` what the
/// strategy needs: the additive offset first if `offset` has none yet (stored there), then
/// the strategy's own draw.
fn ref_delay(
    s: &Spec,
    attempt: u32,
    prev: u64,
    offset: &mut Option<u64>,
    rng: &mut SplitMix64,
) -> Result<u64, Divergence> {
    if s.initial == 0 {
        return Ok(0);
    }
    // gRPC connection backoff: the first wait is INITIAL_BACKOFF, nothing drawn.
    if s.first_unjittered && attempt == 0 {
        return Ok(ref_finish(s, s.initial));
    }
    let base = match s.jitter {
        // `docs/design.md` §3.1: d₀ = initial + off, dₐ₊₁ = min(max, ⌊dₐ·num/den⌋); off drawn
        // first.
        RefJitter::Additive(range, _) => {
            let off = match *offset {
                Some(off) => off,
                None => *offset.insert(ref_below(rng, range)),
            };
            ref_base_from(s, s.initial.saturating_add(off), attempt)?
        }
        RefJitter::None
        | RefJitter::Proportional(_)
        | RefJitter::PerDelay(_)
        | RefJitter::Full
        | RefJitter::Equal
        | RefJitter::Decorrelated => ref_base(s, attempt)?,
    };
    let raw = match s.jitter {
        RefJitter::None => base,
        RefJitter::Proportional(_) if s.initial == s.max => base,
        RefJitter::Proportional(ppm) => {
            // factor uniform in [10⁶ − ppm, 10⁶ + ppm), in ppm
            let ppm = u64::from(ppm);
            let factor = 1_000_000 - ppm + ref_below(rng, 2 * ppm);
            mul_div(base, factor, 1_000_000)
        }
        RefJitter::Additive(..) => base,
        // backon `with_jitter`: d + d·U[0, 1); tower: d + d·j·U[0, 1). Every delay draws.
        RefJitter::PerDelay(ppm) => {
            let factor = 1_000_000 + ref_below(rng, u64::from(ppm));
            mul_div(base, factor, 1_000_000)
        }
        RefJitter::Full => ref_between(rng, 0, base),
        RefJitter::Equal => base / 2 + ref_between(rng, 0, base / 2),
        RefJitter::Decorrelated => ref_between(rng, s.initial, prev.saturating_mul(3)),
    };
    Ok(ref_finish(s, raw))
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Compares a delay with the reference's exact value, and checks the invariants every delay
/// keeps whatever the strategy (so a reference slip shows up as well as a machine one).
fn check_delay(s: &Spec, what: &str, attempt: u32, d: u64, want: u64) -> Result<(), Divergence> {
    if d != want {
        return Err(format!(
            "{what} at attempt {attempt}: {d} ns, reference {want} ns ({:?})",
            s.jitter
        ));
    }
    if s.initial == 0 {
        return if d == 0 {
            Ok(())
        } else {
            Err(format!("{what}: disabled backoff gave {d} ns"))
        };
    }
    // With cap-then-jitter only the jitter's reach bounds a delay: the largest factor.
    let ceiling = match (s.cap_then_jitter, s.jitter) {
        (true, RefJitter::Proportional(ppm)) => {
            mul_div(s.max, 1_000_000 + u64::from(ppm), 1_000_000)
        }
        (true, RefJitter::PerDelay(ppm)) => mul_div(s.max, 1_000_000 + u64::from(ppm), 1_000_000),
        _ => s.max,
    };
    if d > ceiling.max(s.res) {
        return Err(format!("{what}: {d} ns above the largest {ceiling} ns"));
    }
    if d < s.floor {
        return Err(format!("{what}: {d} ns below floor {} ns", s.floor));
    }
    if d == 0 {
        return Err(format!("{what}: an enabled backoff gave a zero delay"));
    }
    if d.checked_rem(s.res).map_or(d != 0, |r| r != 0) {
        return Err(format!("{what}: {d} ns not a multiple of {} ns", s.res));
    }
    let never_earlier = match s.jitter {
        RefJitter::None | RefJitter::Additive(..) | RefJitter::PerDelay(_) => true,
        RefJitter::Proportional(_)
        | RefJitter::Full
        | RefJitter::Equal
        | RefJitter::Decorrelated => false,
    };
    let unjittered = ref_finish(s, ref_base(s, attempt)?);
    if never_earlier && d < unjittered {
        return Err(format!(
            "{what}: {d} ns earlier than the unjittered {unjittered} ns"
        ));
    }
    Ok(())
}

/// Why the reference refused a delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefRefusal {
    Attempts,
    MaxWait,
    Budget,
}

/// The reference sequence.
#[derive(Debug, Default)]
struct RefSeq {
    attempt: u32,
    prev: u64,
    offset: Option<u64>,
    spent: u64,
    exhausted: Option<RefRefusal>,
}

/// Gobblin's `awaitNextRetry`, before it sleeps: `retryNumber > maxRetries` (the retry about
/// to be numbered `attempt + 1`), then `totalWait > maxWait`; neither draws.
fn ref_limit(s: &Spec, r: &RefSeq) -> Option<RefRefusal> {
    let number = u64::from(r.attempt) + 1;
    if s.max_attempts.is_some_and(|n| number > u64::from(n)) {
        Some(RefRefusal::Attempts)
    } else if s.max_wait.is_some_and(|w| r.spent > w) {
        Some(RefRefusal::MaxWait)
    } else {
        None
    }
}

fn machine_refusal(e: Option<Exhausted>) -> Option<RefRefusal> {
    match e {
        None => None,
        Some(Exhausted::Attempts) => Some(RefRefusal::Attempts),
        Some(Exhausted::MaxWait) => Some(RefRefusal::MaxWait),
        Some(Exhausted::Budget) => Some(RefRefusal::Budget),
    }
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
        cfg.max_attempts(),
        cfg.max_wait().map(ns),
        (
            cfg.jitter_order() == JitterOrder::CapThenJitter,
            cfg.first_delay_unjittered(),
        ),
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
        s.max_attempts,
        s.max_wait,
        (s.cap_then_jitter, s.first_unjittered),
    );
    if got == want {
        Ok(())
    } else {
        Err(format!("config reads back {got:?}, expected {want:?}"))
    }
}

/// The machine's RNG and the reference's copy of it, which must stay in the same state: a
/// strategy that draws more, less or differently than its definition shows up here even
/// when the delay happens to match.
struct Rngs {
    machine: SplitMix64,
    reference: SplitMix64,
}

impl Rngs {
    fn new(seed: u64) -> Self {
        Rngs {
            machine: SplitMix64::new(seed),
            reference: SplitMix64::new(seed),
        }
    }

    fn in_step(&self, what: &str) -> Result<(), Divergence> {
        if self.machine == self.reference {
            Ok(())
        } else {
            Err(format!(
                "{what}: the machine's RNG is at {:?}, the reference's at {:?}",
                self.machine, self.reference
            ))
        }
    }
}

/// Drives `next_delay` on the machine and on the reference, and compares them.
fn step_next(
    s: &Spec,
    cfg: &BackoffConfig,
    m: &mut Backoff,
    r: &mut RefSeq,
    rngs: &mut Rngs,
) -> Result<Option<u64>, Divergence> {
    let got = m.next_delay(cfg, &mut rngs.machine).map(ns);
    let want = if r.exhausted.is_some() {
        // A refused sequence refuses again without drawing.
        None
    } else if let Some(why) = ref_limit(s, r) {
        r.exhausted = Some(why);
        None
    } else {
        let prev = if r.attempt == 0 { s.initial } else { r.prev };
        let mut offset = r.offset;
        let d = ref_delay(s, r.attempt, prev, &mut offset, &mut rngs.reference)?;
        let left = s.budget.map(|b| b.saturating_sub(r.spent));
        if left.is_some_and(|left| d > left) {
            r.exhausted = Some(RefRefusal::Budget);
            None
        } else {
            r.attempt = r.attempt.saturating_add(1);
            r.prev = d;
            r.offset = offset;
            r.spent = r.spent.saturating_add(d);
            Some(d)
        }
    };
    match (got, want) {
        (Some(d), Some(w)) => check_delay(s, "next_delay", r.attempt.saturating_sub(1), d, w)?,
        (None, None) => {}
        _ => {
            return Err(format!(
                "next_delay gave {got:?} ns, reference {want:?} ns (budget {:?}, spent {})",
                s.budget, r.spent
            ));
        }
    }
    rngs.in_step("next_delay")?;
    Ok(got)
}

fn check_state(s: &Spec, cfg: &BackoffConfig, m: &Backoff, r: &RefSeq) -> Result<(), Divergence> {
    let got = (
        m.attempt(),
        ns(m.spent()),
        m.is_exhausted(),
        machine_refusal(m.exhausted()),
        m.offset().map(ns),
        m.remaining_budget(cfg).map(ns),
    );
    let want = (
        r.attempt,
        r.spent,
        r.exhausted.is_some(),
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
    let mut cfg = match (built, ref_valid(&s)) {
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

    let mut rngs = Rngs::new(c.u64());
    let mut m = Backoff::new();
    let mut r = RefSeq::default();
    let mut ops = 0;
    while !c.is_empty() && ops < MAX_OPS {
        ops += 1;
        let Some(op) = c.select(11) else {
            continue;
        };
        match op {
            0..=4 => {
                step_next(&s, &cfg, &mut m, &mut r, &mut rngs)?;
            }
            5 => {
                m.reset();
                r = RefSeq::default();
            }
            6 => {
                // A fresh sequence's first draw: a new offset, the stand-in previous delay.
                let a = c.small_or_extreme_u32();
                let d = ns(cfg.delay_for(a, &mut rngs.machine));
                let want = ref_delay(&s, a, stand_in(&s, a)?, &mut None, &mut rngs.reference)?;
                check_delay(&s, "config delay_for", a, d, want)?;
                rngs.in_step("config delay_for")?;
            }
            7 => {
                // This sequence's offset (a throwaway one if none yet); nothing advances.
                let a = if c.bool() {
                    m.attempt()
                } else {
                    c.small_or_extreme_u32()
                };
                let d = ns(m.delay_for(&cfg, a, &mut rngs.machine));
                let prev = r.prev_for(&s, a)?;
                let want = ref_delay(&s, a, prev, &mut r.offset.clone(), &mut rngs.reference)?;
                check_delay(&s, "sequence delay_for", a, d, want)?;
                rngs.in_step("sequence delay_for")?;
            }
            8 => {
                // The query predicts the next delay exactly, given the same RNG state.
                let predicted = ns(m.delay_for(&cfg, m.attempt(), &mut rngs.machine.clone()));
                let exhausted = r.exhausted.is_some() || ref_limit(&s, &r).is_some();
                let left = s.budget.map(|b| b.saturating_sub(r.spent));
                match step_next(&s, &cfg, &mut m, &mut r, &mut rngs)? {
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
            9 => rngs = Rngs::new(c.u64()),
            _ => {
                // Issue 15: rebuild the config with another jitter order, first-delay rule (and
                // once a minimum connect timeout, now ignored; each an optional override), then start a fresh
                // sequence on both sides.
                let mut next = s;
                let mut b = cfg.to_builder();
                if let Some(order) = c.select(2) {
                    next.cap_then_jitter = order == 1;
                    b = b.jitter_order(if order == 1 {
                        JitterOrder::CapThenJitter
                    } else {
                        JitterOrder::JitterThenCap
                    });
                }
                if let Some(first) = c.select(2) {
                    next.first_unjittered = first == 1;
                    b = b.first_delay_unjittered(first == 1);
                }
                // Once a minimum connect timeout (the connection table's setting now): its
                // bytes are still read, so stored inputs keep their meaning, and ignored.
                if let Some(kind) = c.select(3) {
                    if kind >= 2 {
                        let _ = span(&mut c);
                    }
                }
                match (b.build(), ref_valid(&next)) {
                    (Ok(new), true) => {
                        check_getters(&next, &new)?;
                        s = next;
                        cfg = new;
                        m.reset();
                        r = RefSeq::default();
                    }
                    (Err(_), false) => {}
                    (Ok(new), false) => {
                        return Err(format!("accepted invalid {next:?} as {new:?}"));
                    }
                    (Err(e), true) => return Err(format!("refused valid {next:?}: {e}")),
                }
            }
        }
        check_state(&s, &cfg, &m, &r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn every_preset_survives_a_long_run_of_next_delay() {
        for preset in 0..6u8 {
            let mut data = alloc::vec![preset, 0, 0];
            data.extend_from_slice(&[7; 8]);
            data.extend(core::iter::repeat_n(0, 300));
            assert_eq!(check(&data), Ok(()), "preset {preset}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn every_strategy_matches_the_reference_exactly_over_a_long_run() {
        // Two shapes, each with every strategy (mask bit 8 overrides the jitter):
        // the general preset (1 s → 10 s, ×2, 1 ms grid), where ms truncation hides 1 ns slips;
        // and 1001 ns → 60 001 ns, ×3/2, 1 ns grid (mask 31), where odd bases and
        // non-integer growth make every nanosecond count.
        let coarse: &[u8] = &[0, 8, 8];
        let fine: &[u8] = &[0, 31, 31, 5, 0xE9, 0x03, 5, 0x61, 0xEA, 2, 3, 2];
        let strategies: [(&[u8], RefJitter); 7] = [
            (&[0], RefJitter::None),
            (&[1, 0], RefJitter::Proportional(200_000)),
            (
                &[2, 5, 0xF4, 0x01],
                RefJitter::Additive(500, Duration::from_nanos(500)),
            ),
            (&[3], RefJitter::Full),
            (&[4], RefJitter::Equal),
            (&[5], RefJitter::Decorrelated),
            (&[6, 0], RefJitter::PerDelay(1_000_000)),
        ];
        let ops = [0, 0, 0, 8, 6, 3, 7, 0, 7, 1, 0, 0, 8, 5, 6, 0];
        for (shape, res, initial) in [(coarse, MS, 1_000 * MS), (fine, 1, 1_001)] {
            for (bytes, jitter) in strategies {
                let mut data = shape.to_vec();
                data.extend_from_slice(bytes);
                if shape == fine {
                    data.push(0); // resolution 1 ns
                }
                data.extend_from_slice(&[0x5A; 8]);
                for _ in 0..20 {
                    data.extend_from_slice(&ops);
                }
                let (spec, _, built) = decode_spec(&mut Cursor::new(&data));
                let got = (spec.jitter, spec.res, spec.initial, built.is_ok());
                assert_eq!(got, (jitter, res, initial, true));
                assert_eq!(check(&data), Ok(()), "{jitter:?}, {res} ns grid");
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
    fn a_jittered_start_that_grows_too_slowly_is_refused_by_both() {
        // 9 999 ns → max, ×10001/10000, additive range 2 ns, 1 ns grid (mask 31): the start
        // 10 000 ns grows 1 ns per attempt, so a max of 14 097 ns takes 4097 attempts.
        let with_max = |max: u16| {
            let [lo, hi] = max.to_le_bytes();
            let mut data = alloc::vec![0, 31, 31, 5, 0x0F, 0x27, 5, lo, hi];
            data.extend_from_slice(&[3, 0x11, 0x27, 0, 0, 0x10, 0x27, 0, 0]);
            data.extend_from_slice(&[2, 5, 2, 0, 0]);
            data.extend_from_slice(&[0x33; 8]);
            data.extend(core::iter::repeat_n([0u8, 0, 6, 7, 0, 0, 0, 8, 5], 30).flatten());
            data
        };
        let slow = with_max(14_097);
        let (spec, _, built) = decode_spec(&mut Cursor::new(&slow));
        assert_eq!(
            (spec.initial, spec.max, spec.num, spec.den),
            (9_999, 14_097, 10_001, 10_000)
        );
        assert!(matches!(spec.jitter, RefJitter::Additive(2, _)) && spec.res == 1);
        assert!(!ref_valid(&spec) && built.is_err());
        assert_eq!(check(&slow), Ok(()));
        let settles = with_max(14_096);
        let (spec, _, built) = decode_spec(&mut Cursor::new(&settles));
        assert!(ref_valid(&spec) && built.is_ok());
        assert_eq!(check(&settles), Ok(()));
    }

    #[test]
    fn attempt_and_max_wait_limits_match_gobblin_over_long_runs() {
        // Mask 128 alone: the general preset (1 s → 10 s, ×2, ±20 %) with the limits only.
        // A max-wait of zero still grants the first delay (nothing waited is not more than 0).
        let cases: [(&[u8], Option<u32>, Option<u64>); 4] = [
            (&[3, 2, 0], Some(2), None),
            (&[0, 2, 0xB8, 0x0B], None, Some(3_000 * MS)),
            (&[0, 1, 0], None, Some(0)),
            (&[1, 1, 0], Some(0), Some(0)),
        ];
        for (limits, attempts, wait) in cases {
            let mut data = alloc::vec![0, 128, 128];
            data.extend_from_slice(limits);
            data.extend_from_slice(&[0x77; 8]);
            for _ in 0..10 {
                data.extend_from_slice(&[0, 0, 8, 0, 0, 7, 0, 5, 8, 0, 0]);
            }
            let (spec, _, built) = decode_spec(&mut Cursor::new(&data));
            assert_eq!((spec.max_attempts, spec.max_wait), (attempts, wait));
            assert!(built.is_ok());
            assert_eq!(check(&data), Ok(()), "{attempts:?} {wait:?}");
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
