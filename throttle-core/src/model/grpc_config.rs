//! Checker of the gRPC service-config parsers ([`crate::grpc_config`]).
//!
//! The first selector picks the input's form (values `≥ 3` are no-ops, kept free for later):
//!
//! - `0`: the rest of the bytes, as text (lossy UTF-8), goes to all three parsers. Nothing may
//!   panic, and whatever parses must satisfy gRFC A6's invariants (2..=5 attempts, a backoff
//!   that never shrinks, a non-empty set of codes; 1..=1000 tokens and a ratio of at least one
//!   milli-token).
//! - `1`: a `retryPolicy` built from decoded fields (present or missing, in or out of range)
//!   and rendered as JSON with a decoded spelling: key order, camel or snake case, spacing,
//!   unknown keys, `".1s"` durations, codes by name or number. A reference that reads only the
//!   fields computes the expected outcome (valid or not, and every value) and the parser must
//!   agree.
//! - `2`: the same for `retryThrottling`.
//!
//! The reference shares no code with the parser: it never sees the text, only the numbers
//! the text was made from.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write as _;
use core::time::Duration;

use super::{Cursor, Divergence};
use crate::backoff::JitterOrder;
use crate::grpc_config::{GrpcCode, GrpcRetryPolicy, GrpcRetryThrottling, GrpcStatusCodes};

/// Runs the checker on `data`.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    match c.select(3) {
        Some(0) => raw(data.get(1..).unwrap_or_default()),
        Some(1) => policy(&mut c).map(drop),
        Some(2) => throttling(&mut c).map(drop),
        _ => Ok(()),
    }
}

fn raw(bytes: &[u8]) -> Result<(), Divergence> {
    let text = String::from_utf8_lossy(bytes);
    if let Ok(p) = GrpcRetryPolicy::from_json(&text) {
        policy_invariants(&p)?;
    }
    if let Ok(Some(p)) = GrpcRetryPolicy::from_method_config_json(&text) {
        policy_invariants(&p)?;
    }
    if let Ok(t) = GrpcRetryThrottling::from_json(&text) {
        let cfg = t.throttle_config();
        if !(1..=1_000).contains(&cfg.max_tokens()) || cfg.milli_token_ratio() == 0 {
            return Err(format!("{text:?} gave an invalid throttle {cfg:?}"));
        }
    }
    Ok(())
}

fn policy_invariants(p: &GrpcRetryPolicy) -> Result<(), Divergence> {
    let (num, den) = p.backoff().multiplier();
    let ok = (2..=5).contains(&p.max_attempts())
        && p.call_config().max_auto_retries() == p.max_attempts() - 1
        && num >= den
        && !p.backoff().initial().is_zero()
        && p.backoff().initial() <= p.backoff().max()
        && p.backoff().jitter_order() == JitterOrder::CapThenJitter
        && !p.retryable_codes().is_empty();
    if ok {
        Ok(())
    } else {
        Err(format!("a parsed policy breaks gRFC A6's rules: {p:?}"))
    }
}

/// A decimal `int.frac` with `frac_len` fraction digits (the value is `int + frac/10^len`).
#[derive(Clone, Copy, Debug)]
struct Dec {
    int: u64,
    frac: u64,
    frac_len: u32,
}

impl Dec {
    fn decode(c: &mut Cursor<'_>, max_int: u64, max_frac_len: u8) -> Dec {
        let int = u64::from(c.u16()) % (max_int + 1);
        let frac_len = u32::from(c.below(max_frac_len + 1));
        let frac = c.u64() % 10u64.pow(frac_len);
        Dec {
            int,
            frac,
            frac_len,
        }
    }

    fn is_zero(self) -> bool {
        self.int == 0 && self.frac == 0
    }

    /// The value times `10^scale`, truncated (`scale` at least as large as needed is exact).
    fn scaled(self, scale: u32) -> u128 {
        let int = u128::from(self.int) * 10u128.pow(scale);
        let frac = if self.frac_len <= scale {
            u128::from(self.frac) * 10u128.pow(scale - self.frac_len)
        } else {
            u128::from(self.frac) / 10u128.pow(self.frac_len - scale)
        };
        int + frac
    }

    /// As JSON text; `leading_point` writes `.5` for `0.5` (A6's duration examples do).
    fn render(self, out: &mut String, leading_point: bool) {
        if !(leading_point && self.int == 0 && self.frac_len > 0) {
            let _ = write!(out, "{}", self.int);
        }
        if self.frac_len > 0 {
            let _ = write!(
                out,
                ".{:0width$}",
                self.frac,
                width = self.frac_len as usize
            );
        }
    }
}

/// How keys and spacing are spelt in one rendered object.
struct Spelling {
    snake: u8,
    upper_first: bool,
    space: &'static str,
}

impl Spelling {
    fn decode(c: &mut Cursor<'_>) -> Spelling {
        Spelling {
            snake: c.u8(),
            upper_first: c.bool(),
            space: ["", " ", "\n  ", "\t"][usize::from(c.below(4))],
        }
    }

    /// `camel` (e.g. `maxAttempts`) or its snake form, per key bit `i`.
    fn key(&self, i: u32, camel: &str, snake: &str) -> String {
        let mut k = if self.snake & (1 << (i % 8)) != 0 {
            String::from(snake)
        } else {
            String::from(camel)
        };
        if self.upper_first {
            // grpc-go's examples write `MaxAttempts`: the keys match in any ASCII case.
            if let Some(first) = k.get_mut(0..1) {
                first.make_ascii_uppercase();
            }
        }
        k
    }
}

/// Renders `fields` (key, value text) as an object in the order `order` picks, with an unknown
/// key among them when `extra` is set.
fn object(c: &mut Cursor<'_>, sp: &Spelling, mut fields: Vec<(String, String)>) -> String {
    if c.bool() {
        fields.push((
            String::from("hedgingPolicy"),
            String::from("{\"x\": [1, {}]}"),
        ));
    }
    // A decoded rotation and reversal of the key order.
    let n = fields.len().max(1);
    let rot = usize::from(c.u8()) % n;
    fields.rotate_left(rot);
    if c.bool() {
        fields.reverse();
    }
    let mut out = String::from("{");
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{}\"{k}\"{}:{}{v}", sp.space, sp.space, sp.space);
    }
    out.push_str(sp.space);
    out.push('}');
    out
}

const NS: u32 = 9;

/// `Ok(true)` when the parser and the reference both accept the policy.
fn policy(c: &mut Cursor<'_>) -> Result<bool, Divergence> {
    let sp = Spelling::decode(c);
    let attempts = c.bool().then(|| u64::from(c.u8() % 12));
    let initial = c.bool().then(|| Dec::decode(c, 3_000, 9));
    let max = c.bool().then(|| Dec::decode(c, 3_000, 9));
    let multiplier = c.bool().then(|| Dec::decode(c, 20, 3));
    let codes: Option<Vec<(GrpcCode, bool)>> = c.bool().then(|| {
        let n = c.below(5);
        (0..n)
            .map(|_| {
                let code = GrpcCode::from_u32(u32::from(c.below(17))).unwrap_or(GrpcCode::Ok);
                (code, c.bool())
            })
            .collect()
    });
    let leading_point = c.bool();

    let mut fields = Vec::new();
    if let Some(a) = attempts {
        fields.push((sp.key(0, "maxAttempts", "max_attempts"), format!("{a}")));
    }
    let duration = |d: Dec| {
        let mut v = String::from("\"");
        d.render(&mut v, leading_point);
        v.push_str("s\"");
        v
    };
    if let Some(d) = initial {
        fields.push((sp.key(1, "initialBackoff", "initial_backoff"), duration(d)));
    }
    if let Some(d) = max {
        fields.push((sp.key(2, "maxBackoff", "max_backoff"), duration(d)));
    }
    if let Some(m) = multiplier {
        let mut v = String::new();
        m.render(&mut v, false);
        fields.push((sp.key(3, "backoffMultiplier", "backoff_multiplier"), v));
    }
    if let Some(list) = &codes {
        let items: Vec<String> = list
            .iter()
            .map(|(code, by_name)| {
                if *by_name {
                    format!("\"{}\"", code.name())
                } else {
                    format!("{}", *code as u8)
                }
            })
            .collect();
        fields.push((
            sp.key(4, "retryableStatusCodes", "retryable_status_codes"),
            format!("[{}]", items.join(",")),
        ));
    }
    let text = object(c, &sp, fields);
    let wrapped = c.bool();
    let got = if wrapped {
        let method = format!("{{\"name\": [{{\"service\": \"s\"}}], \"retryPolicy\": {text}}}");
        match GrpcRetryPolicy::from_method_config_json(&method) {
            Ok(Some(p)) => Ok(p),
            Ok(None) => return Err(format!("{method}: the retry policy was not found")),
            Err(e) => Err(e),
        }
    } else {
        GrpcRetryPolicy::from_json(&text)
    };

    // The reference: A6's rules over the fields, plus ours (a multiplier of at least 1, and an
    // initial backoff no larger than the maximum).
    let initial_ns = initial.map(|d| d.scaled(NS));
    let max_ns = max.map(|d| d.scaled(NS));
    let want_valid = attempts.is_some_and(|a| a >= 2)
        && initial_ns.is_some_and(|n| n > 0)
        && max_ns.is_some_and(|n| n > 0)
        && multiplier.is_some_and(|m| !m.is_zero() && m.scaled(3) >= 1_000)
        && codes.as_ref().is_some_and(|l| !l.is_empty())
        && initial_ns <= max_ns;
    let p = match (got, want_valid) {
        (Ok(p), true) => p,
        (Err(_), false) => return Ok(false),
        (Ok(p), false) => return Err(format!("{text}: accepted as {p:?}, A6 refuses it")),
        (Err(e), true) => return Err(format!("{text}: refused ({e}), A6 accepts it")),
    };
    let want_attempts = attempts.map_or(0, |a| a.min(5)) as u32;
    let want_codes = codes
        .iter()
        .flatten()
        .fold(GrpcStatusCodes::EMPTY, |set, (code, _)| set.with(*code));
    let (num, den) = p.backoff().multiplier();
    let m = multiplier.map_or(0, |m| m.scaled(3));
    let got_ns = |d: Duration| d.as_nanos();
    let agree = p.max_attempts() == want_attempts
        && p.call_config().max_auto_retries() == want_attempts - 1
        && Some(got_ns(p.backoff().initial())) == initial_ns
        && Some(got_ns(p.backoff().max())) == max_ns
        && u128::from(num) * 1_000 == m * u128::from(den)
        && p.backoff().jitter_order() == JitterOrder::CapThenJitter
        && p.retryable_codes() == want_codes;
    if agree {
        Ok(true)
    } else {
        Err(format!(
            "{text}: parsed {p:?}; want {want_attempts} attempts, initial {initial_ns:?} ns, \
             max {max_ns:?} ns, multiplier {m}/1000, codes {want_codes:?}"
        ))
    }
}

/// `Ok(true)` when the parser and the reference both accept the throttle.
fn throttling(c: &mut Cursor<'_>) -> Result<bool, Divergence> {
    let sp = Spelling::decode(c);
    let tokens = c.bool().then(|| u64::from(c.u16() % 1_200));
    let ratio = c.bool().then(|| Dec::decode(c, 2_000, 6));
    let mut fields = Vec::new();
    if let Some(t) = tokens {
        fields.push((sp.key(0, "maxTokens", "max_tokens"), format!("{t}")));
    }
    if let Some(r) = ratio {
        let mut v = String::new();
        r.render(&mut v, false);
        fields.push((sp.key(1, "tokenRatio", "token_ratio"), v));
    }
    let text = object(c, &sp, fields);
    let got = GrpcRetryThrottling::from_json(&text);
    // A6: 0 < maxTokens <= 1000, tokenRatio > 0 kept to three decimals, truncated; a ratio
    // that truncates to zero is refused.
    let milli = ratio.map(|r| r.scaled(3));
    let want_valid = tokens.is_some_and(|t| (1..=1_000).contains(&t))
        && ratio.is_some_and(|r| !r.is_zero())
        && milli.is_some_and(|m| m >= 1);
    match (got, want_valid) {
        (Ok(t), true) => {
            let cfg = t.throttle_config();
            let want = (tokens.unwrap_or(0), milli.unwrap_or(0));
            if (
                u64::from(cfg.max_tokens()),
                u128::from(cfg.milli_token_ratio()),
            ) == want
            {
                Ok(true)
            } else {
                Err(format!("{text}: parsed {cfg:?}, want {want:?}"))
            }
        }
        (Err(_), false) => Ok(false),
        (Ok(t), false) => Err(format!("{text}: accepted as {t:?}, A6 refuses it")),
        (Err(e), true) => Err(format!("{text}: refused ({e}), A6 accepts it")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(rng: &mut crate::rng::SplitMix64, data: &mut [u8]) {
        for b in data {
            *b = crate::rng::below(rng, 256) as u8;
        }
    }

    /// Random bytes through each of the three forms: no divergence, no panic.
    #[test]
    fn random_inputs_agree_with_the_reference() {
        let mut rng = crate::rng::SplitMix64::new(0x5eed);
        let mut data = [0u8; 96];
        for i in 0..if cfg!(miri) { 60 } else { 30_000 } {
            random(&mut rng, &mut data);
            data[0] = (i % 3) as u8;
            if let Err(d) = check(&data) {
                panic!("{d}");
            }
        }
    }

    /// The structured forms reach both answers, accepted and refused, for policies and
    /// throttles alike: a checker that only ever compared refusals would prove little.
    #[test]
    fn structured_forms_reach_both_answers() {
        let mut rng = crate::rng::SplitMix64::new(7);
        let mut seen = [[0u32; 2]; 2];
        let mut data = [0u8; 96];
        for i in 0..if cfg!(miri) { 40 } else { 20_000 } {
            random(&mut rng, &mut data);
            // Odd bytes make every `bool` true: all fields present, so valid inputs are common.
            if i % 2 == 0 {
                for b in &mut data {
                    *b |= 1;
                }
            }
            let mut c = Cursor::new(&data);
            let form = i % 2;
            let accepted = if form == 0 {
                policy(&mut c)
            } else {
                throttling(&mut c)
            };
            let accepted = accepted.unwrap_or_else(|d| panic!("{d}"));
            seen[form][usize::from(accepted)] += 1;
        }
        assert!(
            seen.iter().flatten().all(|n| *n > 0),
            "refused/accepted per form: {seen:?}"
        );
    }
}
