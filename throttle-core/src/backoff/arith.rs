//! Exact integer arithmetic without a division instruction: growth, `⌊a·b/c⌋`, truncation.

use super::MAX_RAMP_ATTEMPTS;
use crate::divisor::Divisor;

/// `min(cap, ⌊d·num/den⌋)`, exact; `den` is `None` for 1.
pub(super) fn grow(d: u64, num: u32, den: Option<Divisor>, cap: u64) -> u64 {
    grow_narrow(d, num, den, cap).unwrap_or_else(|| {
        let num = u64::from(num);
        match den {
            // `den ≤ u32::MAX` and `num ≤ u32::MAX`: `(den − 1)·num` fits, as `mul_div` needs.
            Some(den) => mul_div(d, num, den.get(), |n| den.div(n)),
            // `d·num` does not fit in `u64`.
            None => u64::MAX,
        }
        .min(cap)
    })
}

/// [`grow`] when `d·num` fits in `u64`, else `None`.
#[inline]
pub(super) fn grow_narrow(d: u64, num: u32, den: Option<Divisor>, cap: u64) -> Option<u64> {
    let p = d.checked_mul(u64::from(num))?;
    // A whole multiplier (every preset but gRPC's) needs no division.
    let q = den.map_or(p, |den| den.div(p));
    Some(q.min(cap))
}

/// `n` rounded down to a multiple of the resolution (`None` for 1 ns).
#[inline]
pub(super) fn round_down(n: u64, res: Option<Divisor>) -> u64 {
    res.map_or(n, |res| res.round_down(n))
}

/// `⌊a·b/c⌋`, exact, saturating at `u64::MAX`, with no 128-bit division, provided
/// `(c − 1)·b` fits in `u64` (both callers guarantee it); `div` divides by `c`.
///
/// The product itself when it fits; otherwise `a = q·c + r` gives `⌊a·b/c⌋ = q·b + ⌊r·b/c⌋`
/// exactly, where `r·b < c·b` fits.
pub(super) fn mul_div(a: u64, b: u64, c: u64, div: impl Fn(u64) -> u64) -> u64 {
    match a.checked_mul(b) {
        Some(p) => div(p),
        None => {
            let q = div(a);
            let r = a - q * c;
            q.saturating_mul(b).saturating_add(div(r.saturating_mul(b)))
        }
    }
}

/// Where the base settles: `(settle, settled)`, or `None` if it is still growing after
/// [`MAX_RAMP_ATTEMPTS`] attempts.
pub(super) fn ramp(initial: u64, max: u64, num: u32, den: Option<Divisor>) -> Option<(u32, u64)> {
    let mut d = initial;
    for a in 0..=MAX_RAMP_ATTEMPTS {
        let next = grow(d, num, den, max);
        if next == d {
            return Some((a, d));
        }
        d = next;
    }
    None
}
