//! The budget checkers: the gRPC throttle, the Finagle budget and the AWS quota, each
//! against a recount of its history.

use super::*;

/// The three retry budgets against a naive recount, including configuration validation.
pub fn check_budget(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    // Which budget is a variant: an unassigned one checks nothing. 0 and 1 are the original
    // budgets; 2, the AWS retry quota, was appended.
    match c.select(3) {
        Some(0) => check_finagle(&mut c),
        Some(1) => check_grpc(&mut c),
        Some(_) => check_aws(&mut c),
        None => Ok(()),
    }
}

/// gRPC throttle recounted: replay every failure, success and replacement from a full
/// bucket. Returns the count and the ceiling in force, in milli-tokens.
pub(super) fn grpc_recount(max_milli: i64, ratio_milli: i64, history: &[GrpcEvent]) -> (i64, i64) {
    let (mut tokens, mut max, mut ratio) = (max_milli, max_milli, ratio_milli);
    for event in history {
        match *event {
            GrpcEvent::Success => tokens = core::cmp::min(max, tokens + ratio),
            GrpcEvent::Failure => tokens = core::cmp::max(0, tokens - 1000),
            // gRPC core keeps the token fraction: tokens / max of the new maximum, rounded
            // down (exact, in integers).
            GrpcEvent::Replace {
                max_milli,
                ratio_milli,
            } => {
                tokens = tokens * max_milli / max;
                max = max_milli;
                ratio = ratio_milli;
            }
        }
    }
    (tokens, max)
}

/// The TTL/10 slice of `at` counted from `anchor`, in the reference's own arithmetic.
pub(super) fn finagle_slice(anchor: Instant, at: Instant, ttl_secs: u64) -> u128 {
    let slice = u128::from(ttl_secs) * 100_000_000;
    u128::from(at.as_nanos().saturating_sub(anchor.as_nanos())) / slice
}

/// Finagle budget recounted: the reserve plus every event whose TTL/10 slice is among the
/// last ten, slices counted from the first deposit or withdrawal.
pub(super) fn finagle_recount(
    reserve: i128,
    ttl_secs: u64,
    anchor: Option<Instant>,
    now: Instant,
    events: &[(Instant, i128)],
) -> i128 {
    let Some(anchor) = anchor else {
        return reserve;
    };
    let current = finagle_slice(anchor, now, ttl_secs);
    reserve
        + events
            .iter()
            .filter(|(at, _)| finagle_slice(anchor, *at, ttl_secs) + 10 > current)
            .map(|(_, a)| *a)
            .sum::<i128>()
}

pub(super) fn budget_time(c: &mut Cursor<'_>, now: Instant) -> Instant {
    // Finagle thinks in seconds: mix small steps with whole-second and TTL-sized leaps.
    match c.below(4) {
        0 => now + Duration::from_secs(u64::from(c.below(70))),
        _ => c.time_step(now),
    }
}

/// A gRPC throttle config as the decoder draws it: the values and whether they are valid.
pub(super) fn grpc_config(c: &mut Cursor<'_>) -> (u32, u32, bool) {
    let max_tokens = match c.below(4) {
        0 => c.small_or_extreme_u32(),
        1 => u32::from(c.u16() % 1_100),
        _ => 1 + u32::from(c.below(12)),
    };
    let ratio = match c.below(4) {
        0 => c.small_or_extreme_u32(),
        _ => u32::from(c.u16() % 2_000),
    };
    let valid = (1..=1_000).contains(&max_tokens) && ratio >= 1;
    (max_tokens, ratio, valid)
}

pub(super) fn check_grpc(c: &mut Cursor<'_>) -> Result<(), Divergence> {
    let (max_tokens, ratio, valid) = grpc_config(c);
    let cfg = GrpcThrottleConfig::default()
        .with_max_tokens(max_tokens)
        .with_milli_token_ratio(ratio);
    let built = GrpcThrottle::new(cfg);
    if cfg.validate().is_ok() != valid || built.is_ok() != valid {
        return Err(format!(
            "grpc config ({max_tokens}, {ratio}): {:?}, valid = {valid}",
            cfg.validate()
        ));
    }
    let (max_milli, ratio_milli) = if valid {
        (i64::from(max_tokens) * 1000, i64::from(ratio))
    } else {
        (10_000, 100)
    };
    let mut real = built.unwrap_or_default();
    let mut history: Vec<GrpcEvent> = Vec::new();
    let mut now = Instant::ZERO;
    let mut step = 0usize;
    while !c.is_empty() {
        step += 1;
        let (tokens, max) = grpc_recount(max_milli, ratio_milli, &history);
        let allowed = 2 * tokens > max;
        // Values 0–5 are the original operations; 6 (replace the config) was appended.
        let Some(op) = c.select(7) else {
            continue;
        };
        match op {
            0 => now = c.time_step(now),
            1 => real.handle_request(now),
            2 => {
                real.handle_failure(now);
                history.push(GrpcEvent::Failure);
            }
            3 => {
                real.handle_success(now);
                history.push(GrpcEvent::Success);
            }
            4 => {
                let got = real.try_withdraw(now);
                if got != allowed {
                    return Err(format!(
                        "step {step}: grpc withdraw {got} at {tokens} milli-tokens"
                    ));
                }
            }
            5 => {
                if real.can_retry(now) != allowed {
                    return Err(format!(
                        "step {step}: grpc can_retry at {tokens} milli-tokens"
                    ));
                }
            }
            _ => {
                let (new_max, new_ratio, new_valid) = grpc_config(c);
                let new = GrpcThrottleConfig::default()
                    .with_max_tokens(new_max)
                    .with_milli_token_ratio(new_ratio);
                let before = real.clone();
                let got = real.set_config(new);
                if got.is_ok() != new_valid {
                    return Err(format!(
                        "step {step}: grpc set_config ({new_max}, {new_ratio}): {got:?}, \
                         valid = {new_valid}"
                    ));
                }
                if new_valid {
                    history.push(GrpcEvent::Replace {
                        max_milli: i64::from(new_max) * 1000,
                        ratio_milli: i64::from(new_ratio),
                    });
                } else if real != before {
                    return Err(format!(
                        "step {step}: a refused grpc config changed the throttle"
                    ));
                }
            }
        }
        let (want, _) = grpc_recount(max_milli, ratio_milli, &history);
        if i64::from(real.milli_tokens()) != want {
            return Err(format!(
                "step {step}: grpc holds {} milli-tokens, recount {want}",
                real.milli_tokens()
            ));
        }
    }
    Ok(())
}

/// Epoch shifts at which twins of the Finagle budget replay the same history.
const FINAGLE_SHIFTS: [u64; 3] = [1, 999_999_999, 123_456_789_012];

/// A twin of the Finagle budget under test: the same history at `now · scale + shift`,
/// whose every answer must equal the original's. It retires the first time a mapped time
/// would leave the timeline (there the equivalence ends).
struct Twin {
    budget: Option<FinagleBudget>,
    scale: u64,
    shift: u64,
}

impl Twin {
    fn map(&mut self, now: Instant) -> Option<Instant> {
        let at = now
            .as_nanos()
            .checked_mul(self.scale)
            .and_then(|n| n.checked_add(self.shift))
            // `Instant::MAX` itself saturates the real budget's own arithmetic: stay below.
            .filter(|n| *n < u64::MAX);
        if at.is_none() {
            self.budget = None;
        }
        at.map(Instant::from_nanos)
    }

    /// Applies `op` to the twin at the mapped time and compares its answer with `want`.
    fn check<T: PartialEq + core::fmt::Debug>(
        &mut self,
        now: Instant,
        want: &T,
        op: impl FnOnce(&mut FinagleBudget, Instant) -> T,
    ) -> Result<(), Divergence> {
        let Some(at) = self.map(now) else {
            return Ok(());
        };
        let Some(b) = self.budget.as_mut() else {
            return Ok(());
        };
        let got = op(b, at);
        if got != *want {
            return Err(format!(
                "twin ×{} +{} ns at {at:?}: {got:?}, the original {want:?}",
                self.scale, self.shift
            ));
        }
        Ok(())
    }
}

pub(super) fn check_finagle(c: &mut Cursor<'_>) -> Result<(), Divergence> {
    let ttl = match c.below(8) {
        0 => c.duration(),
        1 => Duration::from_secs(u64::from(c.below(64))),
        2 => Duration::from_millis(u64::from(c.u16())),
        _ => Duration::from_secs(1 + u64::from(c.below(12))),
    };
    let min_per_sec = match c.below(4) {
        0 => c.small_or_extreme_u32(),
        _ => u32::from(c.below(12)),
    };
    let percent_ppm = match c.below(6) {
        0 => c.u32(),
        1 => 0,
        2 => 1_000_000_000,
        3 => c.u32() % 2_000_000,
        _ => 200_000,
    };
    let valid = ttl.subsec_nanos() == 0
        && ttl.as_secs() >= 1
        && ttl.as_secs() <= 60
        && percent_ppm <= 1_000_000_000;
    let cfg = FinagleBudgetConfig::default()
        .with_ttl(ttl)
        .with_min_retries_per_sec(min_per_sec)
        .with_percent_can_retry_ppm(percent_ppm);
    let built = FinagleBudget::new(cfg);
    if cfg.validate().is_ok() != valid || built.is_ok() != valid {
        return Err(format!(
            "finagle config ({ttl:?}, {min_per_sec}, {percent_ppm}): {:?}, valid = {valid}",
            cfg.validate()
        ));
    }
    let (ttl_secs, min_per_sec, percent_ppm) = if valid {
        (ttl.as_secs(), min_per_sec, percent_ppm)
    } else {
        (10, 10, 200_000)
    };
    let mut real = built.unwrap_or_default();
    // Twins: the same history at shifted epochs, and (where the TTL allows it) at ten times
    // the TTL and ten times the spans, with the reserve kept equal.
    let mut twins: Vec<Twin> = FINAGLE_SHIFTS
        .iter()
        .map(|&shift| Twin {
            budget: Some(real.clone()),
            scale: 1,
            shift,
        })
        .collect();
    if ttl_secs * 10 <= 60 && min_per_sec % 10 == 0 {
        let scaled = FinagleBudgetConfig::default()
            .with_ttl(Duration::from_secs(ttl_secs * 10))
            .with_min_retries_per_sec(min_per_sec / 10)
            .with_percent_can_retry_ppm(percent_ppm);
        twins.push(Twin {
            budget: FinagleBudget::new(scaled).ok(),
            scale: 10,
            shift: 0,
        });
    }
    let reserve = i128::from(min_per_sec) * i128::from(ttl_secs) * 1_000_000;
    let mut events: Vec<(Instant, i128)> = Vec::new();
    let mut anchor: Option<Instant> = None;
    let mut latest = Instant::ZERO;
    let mut now = Instant::ZERO;
    let mut step = 0usize;
    while !c.is_empty() {
        step += 1;
        // The selector comes first so that a no-op reads nothing else, not even a time.
        let Some(op) = c.select(7) else {
            continue;
        };
        now = budget_time(c, now);
        // The reference's own clamp: time never runs backwards.
        let effective = core::cmp::max(now, latest);
        // The first event entering the window (a deposit, or a withdrawal that succeeds) is
        // the anchor: set below, where the reference records one.
        let balance = finagle_recount(reserve, ttl_secs, anchor, effective, &events);
        match op {
            0 => {
                real.handle_request(now);
                latest = effective;
                if percent_ppm > 0 {
                    events.push((effective, i128::from(percent_ppm)));
                    anchor.get_or_insert(effective);
                }
                for t in &mut twins {
                    t.check(now, &(), |b, at| b.handle_request(at))?;
                }
            }
            1 => {
                let got = real.try_withdraw(now);
                latest = effective;
                let want = balance >= 1_000_000;
                if got != want {
                    return Err(format!(
                        "step {step}: finagle withdraw {got} at balance {balance}"
                    ));
                }
                if want {
                    events.push((effective, -1_000_000));
                    anchor.get_or_insert(effective);
                }
                for t in &mut twins {
                    t.check(now, &got, |b, at| b.try_withdraw(at))?;
                }
            }
            // Failure and success are two operations, not one picked by a flag.
            2 => {
                real.handle_failure(now);
                latest = effective;
                for t in &mut twins {
                    t.check(now, &(), |b, at| b.handle_failure(at))?;
                }
            }
            6 => {
                real.handle_success(now);
                latest = effective;
                for t in &mut twins {
                    t.check(now, &(), |b, at| b.handle_success(at))?;
                }
            }
            3 => {
                let got = real.can_retry(now);
                if got != (balance >= 1_000_000) {
                    return Err(format!(
                        "step {step}: finagle can_retry at balance {balance}"
                    ));
                }
                for t in &mut twins {
                    t.check(now, &got, |b, at| b.can_retry(at))?;
                }
            }
            _ => {
                let want = if balance <= 0 { 0 } else { balance / 1_000_000 };
                let got = real.balance(now);
                if i128::from(got) != want {
                    return Err(format!(
                        "step {step}: finagle balance {got} retries, recount {want}"
                    ));
                }
                for t in &mut twins {
                    t.check(now, &got, |b, at| b.balance(at))?;
                }
            }
        }
        if real.anchor() != anchor {
            return Err(format!(
                "step {step}: finagle anchored at {:?}, expected {anchor:?}",
                real.anchor()
            ));
        }
    }
    Ok(())
}

/// What the AWS quota was told, for the recount: tokens taken, or tokens given back.
#[derive(Clone, Copy, Debug)]
pub(super) enum AwsEvent {
    Take(u64),
    Give(u64),
}

/// AWS retry quota recounted: replay every accepted withdrawal and every refill from a full
/// bucket, each refill capped at the maximum.
pub(super) fn aws_recount(max: u64, history: &[AwsEvent]) -> u64 {
    history.iter().fold(max, |tokens, e| match *e {
        AwsEvent::Take(n) => tokens - n,
        AwsEvent::Give(n) => core::cmp::min(max, tokens + n),
    })
}

pub(super) fn aws_cause(c: &mut Cursor<'_>) -> ErrorCause {
    match c.below(3) {
        0 => ErrorCause::Transient,
        1 => ErrorCause::Timeout,
        _ => ErrorCause::Throttling,
    }
}

/// The AWS standard-mode quota: presets and arbitrary costs, every cause, withdrawals,
/// refunds and first-attempt successes, against a recount.
pub(super) fn check_aws(c: &mut Cursor<'_>) -> Result<(), Divergence> {
    let cost = |c: &mut Cursor<'_>| match c.below(4) {
        0 => c.small_or_extreme_u32(),
        _ => u32::from(c.below(20)),
    };
    // The reference's own numbers: (max, transient, timeout, throttling, first-attempt
    // success), the presets written out as the specification gives them.
    let (max, costs, increment, cfg) = match c.below(4) {
        0 => (500, [5, 10, 5], 1, AwsRetryQuotaConfig::aws_standard()),
        1 => (
            500,
            [14, 14, 5],
            1,
            AwsRetryQuotaConfig::aws_standard_2026(),
        ),
        _ => {
            let max = match c.below(4) {
                0 => c.small_or_extreme_u32(),
                _ => u32::from(c.u16() % 1_000),
            };
            let costs = [cost(c), cost(c), cost(c)];
            let increment = cost(c);
            let cfg = AwsRetryQuotaConfig::default()
                .with_max_tokens(max)
                .with_retry_cost(costs[0])
                .with_timeout_cost(costs[1])
                .with_throttling_cost(costs[2])
                .with_no_retry_increment(increment);
            (max, costs, increment, cfg)
        }
    };
    if cfg.validate().is_err() {
        return Err(format!("aws config {cfg:?} refused"));
    }
    let price = |cause: ErrorCause| -> u64 {
        u64::from(match cause {
            ErrorCause::Transient => costs[0],
            ErrorCause::Timeout => costs[1],
            _ => costs[2],
        })
    };
    let max = u64::from(max);
    let mut real = AwsRetryQuota::new(cfg);
    let mut history: Vec<AwsEvent> = Vec::new();
    let mut now = Instant::ZERO;
    let mut step = 0usize;
    while !c.is_empty() {
        step += 1;
        let tokens = aws_recount(max, &history);
        let Some(op) = c.select(7) else {
            continue;
        };
        match op {
            0 => now = c.time_step(now),
            1 | 2 => {
                // A withdrawal for a cause, or the plain one (a transient error's price).
                let cause = if op == 1 {
                    aws_cause(c)
                } else {
                    ErrorCause::Transient
                };
                let got = if op == 1 {
                    real.try_withdraw_for(now, cause)
                } else {
                    real.try_withdraw(now)
                };
                let want = tokens >= price(cause);
                if got != want {
                    return Err(format!(
                        "step {step}: aws withdraw for {cause:?} {got} at {tokens} tokens"
                    ));
                }
                if want {
                    history.push(AwsEvent::Take(price(cause)));
                }
            }
            3 => {
                let cause = aws_cause(c);
                if real.can_retry_for(now, cause) != (tokens >= price(cause)) {
                    return Err(format!(
                        "step {step}: aws can_retry for {cause:?} at {tokens} tokens"
                    ));
                }
                if real.can_retry(now) != (tokens >= price(ErrorCause::Transient)) {
                    return Err(format!("step {step}: aws can_retry at {tokens} tokens"));
                }
            }
            4 => {
                real.handle_success(now);
                history.push(AwsEvent::Give(u64::from(increment)));
            }
            5 => {
                let cause = aws_cause(c);
                real.handle_retry_success(now, cause);
                history.push(AwsEvent::Give(price(cause)));
            }
            _ => {
                real.handle_failure(now);
                real.handle_request(now);
            }
        }
        let want = aws_recount(max, &history);
        if u64::from(real.tokens()) != want {
            return Err(format!(
                "step {step}: aws holds {} tokens, recount {want}",
                real.tokens()
            ));
        }
    }
    Ok(())
}
