//! Retry budgets: a cap on automatic retries shared by every call of a client.
//!
//! A per-call retry limit does not stop a retry storm: when a server is failing, every call
//! retries. A budget shared by the calls of a client bounds retries relative to healthy
//! traffic. Two upstream designs are provided behind one trait, [`RetryBudget`]:
//!
//! - [`GrpcThrottle`]: gRPC retry throttling (gRFC A6). A token count, in milli-tokens, starts
//!   at `max_tokens`; every failure that could be retried costs one token, every success earns
//!   `token_ratio`; no retry is allowed while the count is at most `max_tokens / 2`.
//! - [`FinagleBudget`]: Finagle's `RetryBudget`. Every call deposits `percent_can_retry` of a
//!   retry, every retry withdraws one; deposits and withdrawals expire after `ttl`, and a reserve
//!   of `min_retries_per_sec · ttl` retries is always there for quiet clients.
//!
//! Both count in integers (milli-tokens; millionths of a retry) and take time as an argument.
//! [`Unlimited`] never refuses. The trait is object safe, so `&mut dyn RetryBudget` picks one at
//! run time.

use core::time::Duration;

use crate::error::ConfigError;
use crate::time::{Clock, Instant};

/// A retry budget consulted by a failover [`Call`](super::Call).
///
/// Driving contract: the call reports each event as it happens; [`RetryBudget::try_withdraw`]
/// is the one decision; [`RetryBudget::can_retry`] is a query that changes nothing. A budget is
/// shared: pass the same one to every call of a client.
///
/// The trait is object safe, so the budget can be chosen at run time:
///
/// ```
/// use throttle_sansio::failover::{GrpcThrottle, RetryBudget, Unlimited};
/// use throttle_sansio::Instant;
///
/// let now = Instant::ZERO;
/// let mut budgets: [Box<dyn RetryBudget>; 2] = [Box::new(Unlimited), Box::new(GrpcThrottle::default())];
/// for budget in &mut budgets {
///     budget.handle_request(now);
///     budget.handle_failure(now);
///     assert!(budget.try_withdraw(now), "a healthy client may retry once");
/// }
/// // Five more failures drain gRPC's default bucket (10 tokens) to its half: no more retries.
/// for _ in 0..5 {
///     budgets[1].handle_failure(now);
/// }
/// assert!(!budgets[1].can_retry(now));
/// assert!(budgets[0].can_retry(now), "`Unlimited` never refuses");
/// ```
pub trait RetryBudget {
    /// A call sends its first attempt (retries are not requests: they never deposit).
    fn handle_request(&mut self, now: Instant);
    /// An attempt failed with an error that is safe to retry (gRPC's "qualified failure").
    fn handle_failure(&mut self, now: Instant);
    /// An attempt succeeded.
    fn handle_success(&mut self, now: Instant);
    /// Takes what one automatic retry costs and returns `true`, or returns `false` and takes
    /// nothing when the budget is empty.
    fn try_withdraw(&mut self, now: Instant) -> bool;
    /// Whether [`RetryBudget::try_withdraw`] would succeed now.
    fn can_retry(&self, now: Instant) -> bool;
}

/// A budget that never refuses a retry (the per-call `max_auto_retries` still applies).
///
/// ```
/// use throttle_sansio::failover::{RetryBudget, Unlimited};
/// use throttle_sansio::Instant;
///
/// let mut budget = Unlimited;
/// for _ in 0..1_000 {
///     budget.handle_failure(Instant::ZERO);
/// }
/// assert!(budget.try_withdraw(Instant::ZERO));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unlimited;

impl RetryBudget for Unlimited {
    fn handle_request(&mut self, _now: Instant) {}
    fn handle_failure(&mut self, _now: Instant) {}
    fn handle_success(&mut self, _now: Instant) {}
    fn try_withdraw(&mut self, _now: Instant) -> bool {
        true
    }
    fn can_retry(&self, _now: Instant) -> bool {
        true
    }
}

/// One token in milli-tokens.
const TOKEN: u32 = 1_000;

/// gRPC retry throttling settings (the service config's `retryThrottling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GrpcThrottleConfig {
    max_tokens: u32,
    milli_token_ratio: u32,
}

impl Default for GrpcThrottleConfig {
    /// [`GrpcThrottleConfig::grpc_a6_example`].
    fn default() -> Self {
        Self::grpc_a6_example()
    }
}

impl GrpcThrottleConfig {
    /// The `retryThrottling` of gRFC A6 ("gRPC client retries"): `maxTokens` 10,
    /// `tokenRatio` 0.1. gRPC itself throttles nothing unless a service config sets this
    /// (that is [`Unlimited`]); A6's is the one configuration its documentation gives.
    ///
    /// Eight calls failing at once leave 2 tokens, not above 5: all eight retries are refused.
    /// A throttle that must let `n` simultaneous failures retry needs `max_tokens > 2n`.
    pub fn grpc_a6_example() -> Self {
        GrpcThrottleConfig {
            max_tokens: 10,
            milli_token_ratio: 100,
        }
    }

    /// `maxTokens`, in `1..=1000` (gRPC's range; checked by [`validate`](Self::validate)).
    #[must_use]
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// `tokenRatio` in milli-tokens, at least 1 (gRPC keeps three decimals of `tokenRatio`, so
    /// 0.1 is 100).
    #[must_use]
    pub fn with_milli_token_ratio(mut self, milli_token_ratio: u32) -> Self {
        self.milli_token_ratio = milli_token_ratio;
        self
    }

    /// Refuses `maxTokens` outside `1..=1000` and a zero `tokenRatio`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=1_000).contains(&self.max_tokens) {
            return Err(ConfigError::OutOfRange {
                option: &crate::options::failover::MAX_TOKENS,
                got: u64::from(self.max_tokens),
                min: 1,
                max: 1_000,
                unit: "tokens",
            });
        }
        if self.milli_token_ratio == 0 {
            return Err(ConfigError::OutOfRange {
                option: &crate::options::failover::MILLI_TOKEN_RATIO,
                got: 0,
                min: 1,
                max: u64::from(u32::MAX),
                unit: "milli-tokens",
            });
        }
        Ok(())
    }

    /// `maxTokens`.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// The token ceiling, in milli-tokens.
    pub fn max_milli_tokens(&self) -> u32 {
        // At most 1000 · 1000 once validated; saturating regardless.
        self.max_tokens.saturating_mul(TOKEN)
    }

    /// Milli-tokens earned per success.
    pub fn milli_token_ratio(&self) -> u32 {
        self.milli_token_ratio
    }
}

/// gRPC retry throttling: a token count that failures drain and successes refill.
///
/// Retries are allowed only while `tokens > max_tokens / 2` (integer halving of the
/// milli-token ceiling, as gRPC does). Time plays no part.
///
/// ```
/// use throttle_sansio::failover::{GrpcThrottle, GrpcThrottleConfig, RetryBudget};
/// use throttle_sansio::Instant;
///
/// // maxTokens 4, tokenRatio 0.5: retries stop once the count falls to 2 tokens.
/// let cfg = GrpcThrottleConfig::default().with_max_tokens(4).with_milli_token_ratio(500);
/// let mut budget = GrpcThrottle::new(cfg)?;
/// let now = Instant::ZERO;
/// budget.handle_failure(now); // 3 tokens
/// assert!(budget.try_withdraw(now));
/// budget.handle_failure(now); // 2 tokens: at the threshold
/// assert!(!budget.try_withdraw(now));
/// budget.handle_success(now); // 2.5 tokens
/// assert_eq!(budget.milli_tokens(), 2_500);
/// assert!(budget.can_retry(now));
/// // A config outside gRPC's range is refused, naming the builder method.
/// let err = GrpcThrottle::new(GrpcThrottleConfig::default().with_max_tokens(0)).unwrap_err();
/// assert!(err.to_string().contains("`GrpcThrottleConfig::with_max_tokens`"));
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcThrottle {
    config: GrpcThrottleConfig,
    /// `config.max_milli_tokens()`, read on every decision.
    max_milli_tokens: u32,
    milli_tokens: u32,
}

impl GrpcThrottle {
    /// A full bucket (gRPC starts at `max_tokens`); refuses an invalid `config`.
    pub fn new(config: GrpcThrottleConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::unchecked(config))
    }

    fn unchecked(config: GrpcThrottleConfig) -> Self {
        let max_milli_tokens = config.max_milli_tokens();
        GrpcThrottle {
            milli_tokens: max_milli_tokens,
            max_milli_tokens,
            config,
        }
    }

    /// The current count in milli-tokens.
    pub fn milli_tokens(&self) -> u32 {
        self.milli_tokens
    }

    fn above_threshold(&self) -> bool {
        self.milli_tokens > self.max_milli_tokens / 2
    }
}

impl Default for GrpcThrottle {
    fn default() -> Self {
        GrpcThrottle::unchecked(GrpcThrottleConfig::default())
    }
}

impl RetryBudget for GrpcThrottle {
    fn handle_request(&mut self, _now: Instant) {}

    fn handle_failure(&mut self, _now: Instant) {
        self.milli_tokens = self.milli_tokens.saturating_sub(TOKEN);
    }

    fn handle_success(&mut self, _now: Instant) {
        self.milli_tokens = self
            .milli_tokens
            .saturating_add(self.config.milli_token_ratio)
            .min(self.max_milli_tokens);
    }

    /// A retry costs nothing here: the failure that led to it already paid its token.
    fn try_withdraw(&mut self, now: Instant) -> bool {
        self.can_retry(now)
    }

    fn can_retry(&self, _now: Instant) -> bool {
        self.above_threshold()
    }
}

/// One retry in millionths of a retry: what a withdrawal costs.
const RETRY: i64 = 1_000_000;
/// Finagle's longest TTL, and the size of the fixed ring of one-second slots.
const MAX_TTL_SECS: u32 = 60;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Finagle retry budget settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FinagleBudgetConfig {
    ttl: Duration,
    min_retries_per_sec: u32,
    percent_can_retry_ppm: u32,
}

impl Default for FinagleBudgetConfig {
    /// [`FinagleBudgetConfig::finagle_default`].
    fn default() -> Self {
        Self::finagle_default()
    }
}

impl FinagleBudgetConfig {
    /// Finagle's `RetryBudget()` defaults: TTL 10 s, at least 10 retries per second, 20 % of
    /// requests (so 100 retries in reserve for a quiet client).
    pub fn finagle_default() -> Self {
        FinagleBudgetConfig {
            ttl: Duration::from_secs(10),
            min_retries_per_sec: 10,
            percent_can_retry_ppm: 200_000,
        }
    }

    /// `ttl`: whole seconds in `1..=60` (Finagle's range; the ring has one slot per second).
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// `min_retries_per_sec`: the reserve rate, any value.
    #[must_use]
    pub fn with_min_retries_per_sec(mut self, min_retries_per_sec: u32) -> Self {
        self.min_retries_per_sec = min_retries_per_sec;
        self
    }

    /// `percent_can_retry_ppm`: retries allowed per request, in ppm, `0..=1_000_000_000`
    /// (Finagle allows `0.0..=1000.0`).
    #[must_use]
    pub fn with_percent_can_retry_ppm(mut self, percent_can_retry_ppm: u32) -> Self {
        self.percent_can_retry_ppm = percent_can_retry_ppm;
        self
    }

    /// Refuses a TTL that is not a whole number of seconds in `1..=60`, and a percentage
    /// above 1000 (`1_000_000_000` ppm).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const TTL: &crate::options::ConfigOption = &crate::options::failover::TTL;
        let ttl = self.ttl;
        if ttl.subsec_nanos() != 0 {
            return Err(ConfigError::Invalid {
                option: TTL,
                reason: "must be a whole number of seconds",
            });
        }
        let secs = ttl.as_secs();
        if !(1..=u64::from(MAX_TTL_SECS)).contains(&secs) {
            return Err(ConfigError::OutOfRange {
                option: TTL,
                got: secs,
                min: 1,
                max: u64::from(MAX_TTL_SECS),
                unit: "s",
            });
        }
        if self.percent_can_retry_ppm > 1_000_000_000 {
            return Err(ConfigError::OutOfRange {
                option: &crate::options::failover::PERCENT_CAN_RETRY,
                got: u64::from(self.percent_can_retry_ppm),
                min: 0,
                max: 1_000_000_000,
                unit: "ppm",
            });
        }
        Ok(())
    }

    /// How long a deposit or withdrawal counts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The TTL in whole seconds, in `1..=60` once validated (clamped regardless).
    fn ttl_secs(&self) -> u32 {
        u32::try_from(self.ttl.as_secs())
            .unwrap_or(MAX_TTL_SECS)
            .clamp(1, MAX_TTL_SECS)
    }

    /// The reserve rate.
    pub fn min_retries_per_sec(&self) -> u32 {
        self.min_retries_per_sec
    }

    /// Retries earned per request, in ppm.
    pub fn percent_can_retry_ppm(&self) -> u32 {
        self.percent_can_retry_ppm
    }

    /// The reserve in millionths of a retry: `min_retries_per_sec · ttl` retries.
    fn reserve(&self) -> i128 {
        i128::from(self.min_retries_per_sec) * i128::from(self.ttl_secs()) * i128::from(RETRY)
    }
}

/// One second of deposits minus withdrawals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    second: u64,
    sum: i64,
}

/// Finagle's retry budget: a window of deposits and withdrawals over `ttl`, plus a reserve.
///
/// The balance, in millionths of a retry, is `reserve + Σ(deposits − withdrawals)` over the
/// events of the last `ttl` whole seconds (an event at second `s` counts while
/// `now_sec < s + ttl`); a retry is allowed when the balance is at least one retry. The window
/// is a fixed ring of one-second slots (Finagle slices its TTL into ten; at the default 10 s the
/// two agree), so memory is constant and each decision scans at most 60 slots.
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::failover::{FinagleBudget, FinagleBudgetConfig, RetryBudget};
/// use throttle_sansio::Instant;
///
/// // No reserve, and one retry per two requests (50 %), counted over 2 s.
/// let cfg = FinagleBudgetConfig::default()
///     .with_ttl(Duration::from_secs(2))
///     .with_min_retries_per_sec(0)
///     .with_percent_can_retry_ppm(500_000);
/// let mut budget = FinagleBudget::new(cfg)?;
/// let t0 = Instant::ZERO;
/// budget.handle_request(t0);
/// assert!(!budget.try_withdraw(t0), "half a retry is not a retry");
/// budget.handle_request(t0);
/// assert_eq!(budget.balance(t0), 1);
/// assert!(budget.try_withdraw(t0));
/// assert!(!budget.can_retry(t0));
/// // Deposits expire after the TTL: two requests at t0 earn nothing at t0 + 2 s.
/// budget.handle_request(t0);
/// budget.handle_request(t0);
/// assert!(budget.can_retry(t0));
/// assert!(!budget.can_retry(t0 + Duration::from_secs(2)));
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinagleBudget {
    config: FinagleBudgetConfig,
    /// `config.ttl_secs()`, read on every decision.
    ttl_secs: u32,
    clock: Clock,
    slots: [Slot; MAX_TTL_SECS as usize],
}

impl Default for FinagleBudget {
    fn default() -> Self {
        FinagleBudget::unchecked(FinagleBudgetConfig::default())
    }
}

impl FinagleBudget {
    /// An empty window: only the reserve is available. Refuses an invalid `config`.
    pub fn new(config: FinagleBudgetConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::unchecked(config))
    }

    fn unchecked(config: FinagleBudgetConfig) -> Self {
        FinagleBudget {
            ttl_secs: config.ttl_secs(),
            config,
            clock: Clock::default(),
            slots: [Slot::default(); MAX_TTL_SECS as usize],
        }
    }

    /// Whole retries available now (the balance, rounded down; 0 when negative).
    pub fn balance(&self, now: Instant) -> u64 {
        let b = self.balance_micro(self.clock.peek(now));
        u64::try_from(b / i128::from(RETRY)).unwrap_or(if b > 0 { u64::MAX } else { 0 })
    }

    fn balance_micro(&self, now: Instant) -> i128 {
        let now_sec = now.as_nanos() / NANOS_PER_SEC;
        let ttl = u64::from(self.ttl_secs);
        let window: i128 = self
            .slots
            .iter()
            .take(self.ttl_secs as usize)
            .filter(|s| now_sec.saturating_sub(s.second) < ttl)
            .map(|s| i128::from(s.sum))
            .sum();
        self.config.reserve() + window
    }

    fn add(&mut self, now: Instant, amount: i64) {
        let second = now.as_nanos() / NANOS_PER_SEC;
        // ttl_secs >= 1 by construction; `max(1)` keeps the remainder defined regardless.
        let idx = second % u64::from(self.ttl_secs.max(1));
        if let Some(slot) = self.slots.get_mut(idx as usize) {
            if slot.second != second {
                // The slot last held a second at least one TTL ago: it has expired.
                *slot = Slot { second, sum: 0 };
            }
            slot.sum = slot.sum.saturating_add(amount);
        }
    }
}

impl RetryBudget for FinagleBudget {
    fn handle_request(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        if self.config.percent_can_retry_ppm > 0 {
            self.add(now, i64::from(self.config.percent_can_retry_ppm));
        }
    }

    fn handle_failure(&mut self, now: Instant) {
        self.clock.observe(now);
    }

    fn handle_success(&mut self, now: Instant) {
        self.clock.observe(now);
    }

    fn try_withdraw(&mut self, now: Instant) -> bool {
        let now = self.clock.observe(now);
        if self.balance_micro(now) >= i128::from(RETRY) {
            self.add(now, -RETRY);
            true
        } else {
            false
        }
    }

    fn can_retry(&self, now: Instant) -> bool {
        self.balance_micro(self.clock.peek(now)) >= i128::from(RETRY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Instant = Instant::from_nanos(0);

    fn drain(b: &mut dyn RetryBudget, now: Instant) -> u32 {
        let mut n = 0;
        while b.try_withdraw(now) {
            n += 1;
            assert!(n <= 100_000, "budget never empties");
        }
        n
    }

    #[test]
    fn grpc_throttle_matches_upstream_token_arithmetic() {
        // gRPC core's retry_throttle_test: max 4 tokens (threshold 2), ratio 1.6.
        let mut t = GrpcThrottle::new(
            GrpcThrottleConfig::default()
                .with_max_tokens(4)
                .with_milli_token_ratio(1_600),
        )
        .unwrap();
        assert_eq!(t.milli_tokens(), 4_000);
        t.handle_failure(T0);
        assert_eq!(t.milli_tokens(), 3_000);
        assert!(t.try_withdraw(T0), "3 > 2: above threshold");
        t.handle_success(T0);
        assert_eq!(t.milli_tokens(), 4_000, "not incremented beyond max");
        t.handle_failure(T0);
        t.handle_failure(T0);
        assert_eq!(t.milli_tokens(), 2_000);
        assert!(!t.try_withdraw(T0), "at threshold: no retries");
        t.handle_failure(T0);
        t.handle_failure(T0);
        t.handle_failure(T0);
        assert_eq!(t.milli_tokens(), 0, "never below zero");
        t.handle_success(T0);
        t.handle_success(T0);
        assert_eq!(t.milli_tokens(), 3_200);
        assert!(t.can_retry(T0) && t.try_withdraw(T0), "3.2 > 2");
        assert_eq!(t.milli_tokens(), 3_200, "a retry costs no token itself");
    }

    #[test]
    fn grpc_threshold_halves_odd_milli_tokens_downwards() {
        // max 1 token = 1000 milli, threshold 500: 501 allows, 500 refuses.
        let mut t = GrpcThrottle::new(
            GrpcThrottleConfig::default()
                .with_max_tokens(1)
                .with_milli_token_ratio(1),
        )
        .unwrap();
        t.handle_failure(T0);
        assert_eq!(t.milli_tokens(), 0);
        for _ in 0..500 {
            t.handle_success(T0);
        }
        assert!(!t.can_retry(T0));
        t.handle_success(T0);
        assert!(t.can_retry(T0));
    }

    #[test]
    fn empty_grpc_throttle_stops_retries() {
        let mut t = GrpcThrottle::default();
        // 10 tokens, threshold 5: five failures leave 5 tokens, which is not above 5.
        for _ in 0..4 {
            t.handle_failure(T0);
        }
        assert!(t.try_withdraw(T0));
        t.handle_failure(T0);
        assert_eq!(t.milli_tokens(), 5_000);
        assert!(!t.try_withdraw(T0));
        assert!(!t.can_retry(T0));
    }

    #[test]
    fn grpc_config_is_validated() {
        assert!(
            GrpcThrottleConfig::default()
                .with_max_tokens(0)
                .with_milli_token_ratio(100)
                .validate()
                .is_err()
        );
        assert!(
            GrpcThrottleConfig::default()
                .with_max_tokens(1_001)
                .with_milli_token_ratio(100)
                .validate()
                .is_err()
        );
        assert!(
            GrpcThrottleConfig::default()
                .with_max_tokens(10)
                .with_milli_token_ratio(0)
                .validate()
                .is_err()
        );
        let c = GrpcThrottleConfig::default()
            .with_max_tokens(1_000)
            .with_milli_token_ratio(u32::MAX);
        assert_eq!(c.max_milli_tokens(), 1_000_000);
        let mut t = GrpcThrottle::new(c).unwrap();
        t.handle_failure(T0);
        t.handle_success(T0);
        assert_eq!(t.milli_tokens(), 1_000_000, "a huge ratio saturates at max");
    }

    #[test]
    fn finagle_reserve_is_min_retries_times_ttl() {
        // Finagle default: 10 retries/s over 10 s, so 100 retries with no traffic at all.
        let mut b = FinagleBudget::default();
        assert_eq!(b.balance(T0), 100);
        assert_eq!(drain(&mut b, T0), 100);
        assert_eq!(b.balance(T0), 0);
        assert!(!b.can_retry(T0));
    }

    #[test]
    fn finagle_deposits_twenty_percent_of_requests() {
        let mut b = FinagleBudget::default();
        let t = Instant::from_millis(500);
        for _ in 0..100 {
            b.handle_request(t);
        }
        // 100 requests · 20 % = 20 retries on top of the 100 in reserve.
        assert_eq!(b.balance(t), 120);
        b.handle_request(t);
        b.handle_request(t);
        b.handle_request(t);
        b.handle_request(t);
        assert_eq!(
            b.balance(t),
            120,
            "four more requests are 0.8 of a retry: rounds down"
        );
        b.handle_request(t);
        assert_eq!(b.balance(t), 121, "the fifth completes a retry");
        assert_eq!(drain(&mut b, t), 121);
    }

    #[test]
    fn finagle_deposits_and_withdrawals_expire_after_ttl() {
        let mut b = FinagleBudget::default();
        for _ in 0..50 {
            b.handle_request(Instant::from_millis(1_900)); // second 1
        }
        assert_eq!(b.balance(Instant::from_millis(1_900)), 110);
        // Second 10 is the last second the deposit counts in (1 + 10 > 10).
        assert_eq!(b.balance(Instant::from_millis(10_999)), 110);
        assert_eq!(
            b.balance(Instant::from_millis(11_000)),
            100,
            "expired at second 11"
        );
        // Withdrawals expire too: the reserve refills.
        let mut b = FinagleBudget::default();
        assert_eq!(drain(&mut b, secs(3)), 100);
        assert!(!b.can_retry(secs(12)));
        assert_eq!(b.balance(secs(13)), 100);
    }

    #[test]
    fn finagle_zero_percent_and_zero_floor_never_retries() {
        let mut b = FinagleBudget::new(
            FinagleBudgetConfig::default()
                .with_ttl(Duration::from_secs(1))
                .with_min_retries_per_sec(0)
                .with_percent_can_retry_ppm(0),
        )
        .unwrap();
        b.handle_request(T0);
        assert!(!b.try_withdraw(T0));
        assert_eq!(b.balance(T0), 0);
    }

    /// A Finagle budget config from its three settings.
    fn finagle(ttl: Duration, min_per_sec: u32, ppm: u32) -> FinagleBudgetConfig {
        FinagleBudgetConfig::default()
            .with_ttl(ttl)
            .with_min_retries_per_sec(min_per_sec)
            .with_percent_can_retry_ppm(ppm)
    }

    #[test]
    fn finagle_config_is_validated() {
        for bad in [
            finagle(Duration::ZERO, 10, 0),
            finagle(Duration::from_secs(61), 10, 0),
            finagle(Duration::from_millis(1_500), 10, 0),
            finagle(Duration::from_secs(60), 10, 1_000_000_001),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let c = FinagleBudgetConfig::default()
            .with_ttl(Duration::from_secs(60))
            .with_min_retries_per_sec(u32::MAX)
            .with_percent_can_retry_ppm(1_000_000_000);
        let mut b = FinagleBudget::new(c).unwrap();
        b.handle_request(Instant::MAX);
        // Reserve u32::MAX · 60 plus 1000 retries for the one request.
        assert_eq!(b.balance(Instant::MAX), u64::from(u32::MAX) * 60 + 1_000);
    }

    #[test]
    fn finagle_survives_time_backwards_and_the_end_of_time() {
        let mut b = FinagleBudget::new(
            FinagleBudgetConfig::default()
                .with_ttl(Duration::from_secs(1))
                .with_min_retries_per_sec(1)
                .with_percent_can_retry_ppm(0),
        )
        .unwrap();
        assert!(b.try_withdraw(Instant::MAX));
        // Time runs back: still the last second, still empty.
        assert!(!b.try_withdraw(T0));
        assert!(!b.can_retry(Instant::from_millis(5)));
        assert_eq!(b.balance(T0), 0);
    }

    #[test]
    fn unlimited_never_refuses() {
        let mut u = Unlimited;
        u.handle_failure(T0);
        assert_eq!(drain_n(&mut u, 1_000), 1_000);
    }

    fn drain_n(b: &mut dyn RetryBudget, n: u32) -> u32 {
        (0..n).filter(|_| b.try_withdraw(T0)).count() as u32
    }

    fn secs(s: u64) -> Instant {
        Instant::from_millis(s * 1_000)
    }
}
