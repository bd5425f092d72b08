//! Retry budgets: a cap on automatic retries shared by every call of a client.
//!
//! A per-call retry limit does not stop a retry storm: when a server is failing, every call
//! retries. A budget shared by the calls of a client bounds retries relative to healthy
//! traffic. Three upstream designs are provided behind one trait, [`RetryBudget`]:
//!
//! - [`GrpcThrottle`]: gRPC retry throttling (gRFC A6). A token count, in milli-tokens, starts
//!   at `max_tokens`; every failure that could be retried costs one token, every success earns
//!   `token_ratio`; no retry is allowed while the count is at most `max_tokens / 2`. A config
//!   replaced in place ([`GrpcThrottle::set_config`]) keeps the token fraction, as gRPC does.
//! - [`FinagleBudget`]: Finagle's `RetryBudget` (and tower's `TpsBudget`). Every call deposits
//!   `percent_can_retry` of a retry, every retry withdraws one; deposits and withdrawals count
//!   for `ttl`, in ten slices of `ttl / 10`, and a reserve of `min_retries_per_sec · ttl`
//!   retries is always there for quiet clients.
//! - [`AwsRetryQuota`]: the AWS SDKs' standard-mode retry quota. A bucket of 500 tokens; a
//!   retry costs 5 (10 after a timeout), a success on a retry refunds that cost, a success at
//!   the first attempt adds 1; a retry the bucket cannot pay is refused.
//!
//! All count in integers (milli-tokens; millionths of a retry; tokens) and take time as an
//! argument. [`Unlimited`] never refuses. The trait is object safe, so `&mut dyn RetryBudget`
//! picks one at run time.

use core::time::Duration;

use super::classify::ErrorCause;
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
///
/// A budget that prices retries by their cause ([`AwsRetryQuota`]) overrides the three
/// `…_for` / `handle_retry_success` methods; the others keep their defaults, which ignore the
/// cause and call the plain method, so a budget written before causes existed behaves as it
/// did. A [`Call`](super::Call) calls only [`RetryBudget::try_withdraw_for`] and reports a
/// success on a retry through [`RetryBudget::handle_retry_success`].
pub trait RetryBudget {
    /// A call sends its first attempt (retries are not requests: they never deposit).
    fn handle_request(&mut self, now: Instant);
    /// An attempt failed with an error that is safe to retry (gRPC's "qualified failure").
    fn handle_failure(&mut self, now: Instant);
    /// An attempt succeeded: the first attempt of its call, or, for a budget that does not
    /// override [`RetryBudget::handle_retry_success`], any attempt.
    fn handle_success(&mut self, now: Instant);
    /// Takes what one automatic retry costs and returns `true`, or returns `false` and takes
    /// nothing when the budget is empty.
    fn try_withdraw(&mut self, now: Instant) -> bool;
    /// Whether [`RetryBudget::try_withdraw`] would succeed now.
    fn can_retry(&self, now: Instant) -> bool;

    /// Takes what a retry after an error of `cause` costs, like
    /// [`RetryBudget::try_withdraw`]. Default: the cause is ignored.
    fn try_withdraw_for(&mut self, now: Instant, cause: ErrorCause) -> bool {
        let _ = cause;
        self.try_withdraw(now)
    }

    /// Whether [`RetryBudget::try_withdraw_for`] would succeed now. Default: the cause is
    /// ignored.
    fn can_retry_for(&self, now: Instant, cause: ErrorCause) -> bool {
        let _ = cause;
        self.can_retry(now)
    }

    /// A retry succeeded; `cause` is the cause it was withdrawn for (the call's latest retry).
    /// Default: [`RetryBudget::handle_success`].
    fn handle_retry_success(&mut self, now: Instant, cause: ErrorCause) {
        let _ = cause;
        self.handle_success(now);
    }
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

    /// The settings in force.
    pub fn config(&self) -> &GrpcThrottleConfig {
        &self.config
    }

    /// Command: replaces the settings (a service-config update), keeping the token fraction.
    ///
    /// gRPC core does the same when a channel's `retryThrottling` changes
    /// (`src/core/client_channel/retry_throttle.cc`): the new throttle starts at
    /// `tokens / old_max` of the new maximum, so a client that was throttling keeps
    /// throttling. 3 of 4 tokens become 7.5 of 10. The rule here is exact integer arithmetic:
    /// `⌊milli_tokens · new_max / old_max⌋` milli-tokens, rounded down (gRPC multiplies a
    /// `double` fraction and truncates; the two agree except where the `double` product rounds
    /// across an integer, and then this one is the exact floor). An invalid `config` is
    /// refused and changes nothing.
    ///
    /// ```
    /// use throttle_sansio::failover::{GrpcThrottle, GrpcThrottleConfig, RetryBudget};
    /// use throttle_sansio::Instant;
    ///
    /// let mut t = GrpcThrottle::new(GrpcThrottleConfig::default().with_max_tokens(4))?;
    /// t.handle_failure(Instant::ZERO); // 3 of 4 tokens
    /// t.set_config(GrpcThrottleConfig::default().with_max_tokens(10))?;
    /// assert_eq!(t.milli_tokens(), 7_500);
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    pub fn set_config(&mut self, config: GrpcThrottleConfig) -> Result<(), ConfigError> {
        config.validate()?;
        let new_max = config.max_milli_tokens();
        // `max_milli_tokens` is at least 1000 for a valid config; `max(1)` keeps the division
        // defined regardless. The quotient is at most `new_max`, so it fits in a u32.
        let scaled = u64::from(self.milli_tokens) * u64::from(new_max)
            / u64::from(self.max_milli_tokens.max(1));
        self.milli_tokens = u32::try_from(scaled).unwrap_or(new_max).min(new_max);
        self.max_milli_tokens = new_max;
        self.config = config;
        Ok(())
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
/// Finagle's longest TTL.
const MAX_TTL_SECS: u32 = 60;
/// The window counts in this many slices of `ttl / SLICES` (Finagle's and tower's ten).
const SLICES: u64 = 10;
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
    /// requests (so 100 retries in reserve for a quiet client). tower's `TpsBudget::default()`
    /// is the same.
    pub fn finagle_default() -> Self {
        FinagleBudgetConfig {
            ttl: Duration::from_secs(10),
            min_retries_per_sec: 10,
            percent_can_retry_ppm: 200_000,
        }
    }

    /// `ttl`: whole seconds in `1..=60` (Finagle's and tower's range). The window counts in
    /// slices of `ttl / 10`.
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

    /// How long a deposit or withdrawal counts (at most; see [`FinagleBudget`]).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The TTL in whole seconds, in `1..=60` once validated (clamped regardless).
    fn ttl_secs(&self) -> u32 {
        u32::try_from(self.ttl.as_secs())
            .unwrap_or(MAX_TTL_SECS)
            .clamp(1, MAX_TTL_SECS)
    }

    /// One slice of the window, `ttl / 10`, in nanoseconds (100 ms at TTL 1 s).
    fn slice_nanos(&self) -> u64 {
        u64::from(self.ttl_secs()) * (NANOS_PER_SEC / SLICES)
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

/// One slice of deposits minus withdrawals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    /// The slice's number, counted from the budget's first deposit or withdrawal.
    slice: u64,
    sum: i64,
}

/// Finagle's retry budget: a window of deposits and withdrawals over `ttl`, plus a reserve.
///
/// Time is cut into slices of `ttl / 10` (100 ms at TTL 1 s, 1 s at 10 s, 6 s at 60 s),
/// numbered from the budget's **first deposit or withdrawal** (the `now` of the first
/// `handle_request` that deposits, or `try_withdraw` that withdraws; outcomes, refused
/// withdrawals and requests that deposit nothing do not set the grid), so the answer never
/// depends on where the timeline's epoch lies, nor on anything before the window's first
/// event, only on the spans between its events. An
/// event in slice `k` counts while the current slice is below `k + 10`: it lives more than
/// `0.9 · ttl` and at most `ttl`, at every TTL. The balance, in millionths of a retry, is
/// `reserve + Σ(deposits − withdrawals)` over the events that count; a retry is allowed when
/// it is at least one retry. The reserve, `min_retries_per_sec · ttl` retries, is never
/// consumed itself: a retry taken from it is a withdrawal like any other and stops counting
/// after the TTL, so the reserve refills by itself (tower's and Finagle's rule).
///
/// The window is a fixed ring of ten slots: constant memory, ten slot reads per decision, no
/// floats. Finagle keeps nine finished slices plus the current one, like this; tower keeps
/// ten finished slices plus the current one, so its deposits live up to `1.1 · ttl`. Both
/// re-anchor their slices at each rotation (to the event that rotates them), so their
/// boundaries drift with the traffic; these stay on the grid set by the first deposit or
/// withdrawal.
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::failover::{FinagleBudget, FinagleBudgetConfig, RetryBudget};
/// use throttle_sansio::Instant;
///
/// // tower's `tps_slots`: TTL 1 s, no reserve, one retry per two requests (50 %).
/// let cfg = FinagleBudgetConfig::default()
///     .with_ttl(Duration::from_secs(1))
///     .with_min_retries_per_sec(0)
///     .with_percent_can_retry_ppm(500_000);
/// let mut budget = FinagleBudget::new(cfg)?;
/// let ms = Instant::from_millis;
/// budget.handle_request(ms(0));
/// budget.handle_request(ms(0));
/// assert!(budget.try_withdraw(ms(901)), "900 ms later the deposits still count");
/// budget.handle_request(ms(2_902));
/// budget.handle_request(ms(3_203));
/// budget.handle_request(ms(4_004));
/// // The 2,902 ms deposit has expired; the 3,203 ms one still counts with the 4,004 ms one.
/// assert_eq!(budget.balance(ms(4_004)), 1);
/// assert!(budget.try_withdraw(ms(4_004)));
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinagleBudget {
    config: FinagleBudgetConfig,
    /// `config.slice_nanos()`, read on every decision.
    slice_nanos: u64,
    clock: Clock,
    /// The first deposit or withdrawal: slice 0 starts here.
    anchor: Option<Instant>,
    slots: [Slot; SLICES as usize],
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
            slice_nanos: config.slice_nanos(),
            config,
            clock: Clock::default(),
            anchor: None,
            slots: [Slot::default(); SLICES as usize],
        }
    }

    /// Whole retries available now (the balance, rounded down; 0 when negative).
    pub fn balance(&self, now: Instant) -> u64 {
        let b = self.balance_micro(self.clock.peek(now));
        u64::try_from(b / i128::from(RETRY)).unwrap_or(if b > 0 { u64::MAX } else { 0 })
    }

    /// The first deposit or withdrawal, where slice 0 starts (`None` before either).
    pub fn anchor(&self) -> Option<Instant> {
        self.anchor
    }

    /// The slice `now` falls in (`now` is never before the anchor: the clock is clamped).
    fn slice(&self, anchor: Instant, now: Instant) -> u64 {
        // `slice_nanos` is at least 100 ms by construction; `max(1)` keeps it defined.
        now.as_nanos().saturating_sub(anchor.as_nanos()) / self.slice_nanos.max(1)
    }

    fn balance_micro(&self, now: Instant) -> i128 {
        let window: i128 = match self.anchor {
            None => 0,
            Some(anchor) => {
                let current = self.slice(anchor, now);
                self.slots
                    .iter()
                    .filter(|s| current.saturating_sub(s.slice) < SLICES)
                    .map(|s| i128::from(s.sum))
                    .sum()
            }
        };
        self.config.reserve() + window
    }

    /// Observes `now` (clamped).
    fn observe(&mut self, now: Instant) -> Instant {
        self.clock.observe(now)
    }

    /// A deposit or withdrawal at `now` (clamped); the first one anchors the grid.
    fn add(&mut self, now: Instant, amount: i64) {
        let anchor = *self.anchor.get_or_insert(now);
        let slice = self.slice(anchor, now);
        if let Some(slot) = self.slots.get_mut((slice % SLICES) as usize) {
            if slot.slice != slice {
                // The slot last held a slice at least ten slices ago: it has expired.
                *slot = Slot { slice, sum: 0 };
            }
            slot.sum = slot.sum.saturating_add(amount);
        }
    }
}

impl RetryBudget for FinagleBudget {
    fn handle_request(&mut self, now: Instant) {
        let now = self.observe(now);
        if self.config.percent_can_retry_ppm > 0 {
            self.add(now, i64::from(self.config.percent_can_retry_ppm));
        }
    }

    fn handle_failure(&mut self, now: Instant) {
        // Nothing enters the window: only the clock sees `now` (no anchor).
        self.observe(now);
    }

    fn handle_success(&mut self, now: Instant) {
        self.observe(now);
    }

    fn try_withdraw(&mut self, now: Instant) -> bool {
        let now = self.observe(now);
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

/// AWS SDK standard-mode retry quota settings.
///
/// Every combination is valid: a cost above `max_tokens` only means that retry is never paid
/// for, and a zero cost makes that retry free.
///
/// ```
/// use throttle_sansio::failover::{AwsRetryQuotaConfig, ErrorCause};
///
/// let classic = AwsRetryQuotaConfig::aws_standard();
/// assert_eq!((classic.max_tokens(), classic.cost(ErrorCause::Timeout)), (500, 10));
/// let revised = AwsRetryQuotaConfig::aws_standard_2026();
/// assert_eq!(revised.cost(ErrorCause::Timeout), 14);
/// assert_eq!(revised.cost(ErrorCause::Throttling), 5);
/// let custom = AwsRetryQuotaConfig::default().with_max_tokens(100).with_retry_cost(2);
/// assert_eq!((custom.max_tokens(), custom.cost(ErrorCause::Transient)), (100, 2));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AwsRetryQuotaConfig {
    max_tokens: u32,
    retry_cost: u32,
    timeout_cost: u32,
    throttling_cost: u32,
    no_retry_increment: u32,
}

impl Default for AwsRetryQuotaConfig {
    /// [`AwsRetryQuotaConfig::aws_standard`].
    fn default() -> Self {
        Self::aws_standard()
    }
}

impl AwsRetryQuotaConfig {
    /// The standard retry mode's quota ("Retry behavior", AWS SDKs and Tools reference guide;
    /// smithy-rs `TokenBucket`: `DEFAULT_CAPACITY` 500, `RETRY_COST` 5,
    /// `RETRY_TIMEOUT_COST` 10, `PERMIT_REGENERATION_AMOUNT` 1; aws-sdk-js-v3
    /// `INITIAL_RETRY_TOKENS`, `RETRY_COST`, `TIMEOUT_RETRY_COST`, `NO_RETRY_INCREMENT`): a
    /// bucket of 500 tokens, a retry costs 5, a retry after a timeout 10 (throttling is not a
    /// timeout: 5), a success at the first attempt adds 1.
    pub fn aws_standard() -> Self {
        AwsRetryQuotaConfig {
            max_tokens: 500,
            retry_cost: 5,
            timeout_cost: 10,
            throttling_cost: 5,
            no_retry_increment: 1,
        }
    }

    /// The 2026 revision of standard mode (opt-in with `AWS_NEW_RETRIES_2026=true`): a retry
    /// costs 14 tokens, timeouts included (they are no longer priced apart), a retry after a
    /// throttling error 5; still 500 tokens and 1 per success at the first attempt.
    pub fn aws_standard_2026() -> Self {
        AwsRetryQuotaConfig {
            max_tokens: 500,
            retry_cost: 14,
            timeout_cost: 14,
            throttling_cost: 5,
            no_retry_increment: 1,
        }
    }

    /// The bucket's size; it starts full.
    #[must_use]
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// What a retry after an [`ErrorCause::Transient`] error costs.
    #[must_use]
    pub fn with_retry_cost(mut self, cost: u32) -> Self {
        self.retry_cost = cost;
        self
    }

    /// What a retry after an [`ErrorCause::Timeout`] error costs.
    #[must_use]
    pub fn with_timeout_cost(mut self, cost: u32) -> Self {
        self.timeout_cost = cost;
        self
    }

    /// What a retry after an [`ErrorCause::Throttling`] error costs.
    #[must_use]
    pub fn with_throttling_cost(mut self, cost: u32) -> Self {
        self.throttling_cost = cost;
        self
    }

    /// What a success at the first attempt adds (never above `max_tokens`).
    #[must_use]
    pub fn with_no_retry_increment(mut self, increment: u32) -> Self {
        self.no_retry_increment = increment;
        self
    }

    /// Every combination is valid; this exists so every config is checked the same way.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// The bucket's size.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// What a retry after an error of `cause` costs.
    pub fn cost(&self, cause: ErrorCause) -> u32 {
        match cause {
            ErrorCause::Transient => self.retry_cost,
            ErrorCause::Timeout => self.timeout_cost,
            ErrorCause::Throttling => self.throttling_cost,
        }
    }

    /// What a success at the first attempt adds.
    pub fn no_retry_increment(&self) -> u32 {
        self.no_retry_increment
    }
}

/// The AWS SDKs' standard-mode retry quota: a token bucket that retries drain and successes
/// refill.
///
/// - Starts full, at `max_tokens` (500).
/// - A retry after an error of cause `c` takes `cost(c)` tokens (5; 10 after a timeout) when
///   the bucket holds at least that many, and is refused, taking nothing, otherwise
///   ([`RetryBudget::try_withdraw_for`]; the plain `try_withdraw` prices a transient error).
/// - A success on a retry gives back what that retry cost
///   ([`RetryBudget::handle_retry_success`]); a success at the first attempt adds
///   `no_retry_increment` (1) ([`RetryBudget::handle_success`]). Neither goes above
///   `max_tokens` (aws-sdk-js-v3's `releaseRetryTokens` caps the same way).
/// - A failure changes nothing (its retry pays). Time plays no part.
///
/// ```
/// use throttle_sansio::failover::{AwsRetryQuota, ErrorCause, RetryBudget};
/// use throttle_sansio::Instant;
///
/// let (mut quota, now) = (AwsRetryQuota::default(), Instant::ZERO);
/// assert!(quota.try_withdraw_for(now, ErrorCause::Timeout));
/// assert_eq!(quota.tokens(), 490, "a retry after a timeout costs 10");
/// quota.handle_retry_success(now, ErrorCause::Timeout);
/// assert_eq!(quota.tokens(), 500, "its success refunds the 10");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsRetryQuota {
    config: AwsRetryQuotaConfig,
    tokens: u32,
}

impl Default for AwsRetryQuota {
    /// A full bucket of [`AwsRetryQuotaConfig::aws_standard`].
    fn default() -> Self {
        AwsRetryQuota::new(AwsRetryQuotaConfig::default())
    }
}

impl AwsRetryQuota {
    /// A full bucket.
    pub fn new(config: AwsRetryQuotaConfig) -> Self {
        AwsRetryQuota {
            tokens: config.max_tokens,
            config,
        }
    }

    /// Tokens in the bucket now.
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// The settings in force.
    pub fn config(&self) -> &AwsRetryQuotaConfig {
        &self.config
    }

    fn refill(&mut self, amount: u32) {
        self.tokens = self
            .tokens
            .saturating_add(amount)
            .min(self.config.max_tokens);
    }
}

impl RetryBudget for AwsRetryQuota {
    fn handle_request(&mut self, _now: Instant) {}

    fn handle_failure(&mut self, _now: Instant) {}

    fn handle_success(&mut self, _now: Instant) {
        self.refill(self.config.no_retry_increment);
    }

    fn try_withdraw(&mut self, now: Instant) -> bool {
        self.try_withdraw_for(now, ErrorCause::Transient)
    }

    fn can_retry(&self, now: Instant) -> bool {
        self.can_retry_for(now, ErrorCause::Transient)
    }

    fn try_withdraw_for(&mut self, _now: Instant, cause: ErrorCause) -> bool {
        match self.tokens.checked_sub(self.config.cost(cause)) {
            Some(left) => {
                self.tokens = left;
                true
            }
            None => false,
        }
    }

    fn can_retry_for(&self, _now: Instant, cause: ErrorCause) -> bool {
        self.tokens >= self.config.cost(cause)
    }

    fn handle_retry_success(&mut self, _now: Instant, cause: ErrorCause) {
        self.refill(self.config.cost(cause));
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
            b.handle_request(Instant::from_millis(1_900)); // the anchor: slice 0
        }
        assert_eq!(b.anchor(), Some(Instant::from_millis(1_900)));
        assert_eq!(b.balance(Instant::from_millis(1_900)), 110);
        // Slices of 1 s from 1.9 s: slice 0 counts up to slice 9, which ends at 11.9 s.
        assert_eq!(
            b.balance(Instant::from_millis(11_900) - Duration::from_nanos(1)),
            110
        );
        assert_eq!(
            b.balance(Instant::from_millis(11_900)),
            100,
            "expired one TTL after the anchor"
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

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    /// A Finagle budget with a whole-second TTL, a reserve rate and a percentage in ppm.
    fn finagle_budget(ttl_secs: u64, min_per_sec: u32, ppm: u32) -> FinagleBudget {
        FinagleBudget::new(finagle(Duration::from_secs(ttl_secs), min_per_sec, ppm)).unwrap()
    }

    #[test]
    fn tower_tps_slots_the_issue_example() {
        // tower-rs/tower, tower/src/retry/budget/tps_budget.rs, test `tps_slots`: TTL 1 s,
        // no reserve, 0.5; created (first used) at 0 ms. Issue 15, item 1: the whole-second
        // slots refused the withdrawal at 4,004 ms (the 3,203 ms deposit expired at 4,000).
        let mut b = finagle_budget(1, 0, 500_000);
        b.handle_request(ms(0));
        b.handle_request(ms(0));
        // "900ms later, the deposit should still be valid".
        assert!(b.try_withdraw(ms(901)));
        // "blank slate" 2,001 ms later.
        b.handle_request(ms(2_902));
        b.handle_request(ms(3_203));
        b.handle_request(ms(4_004));
        // "the first deposit is expired, but the 2nd should still be valid, combining with
        // the 3rd".
        assert_eq!(b.balance(ms(4_004)), 1);
        assert!(b.try_withdraw(ms(4_004)));
        assert!(!b.can_retry(ms(4_004)));
        // The 3,203 ms deposit (slice 32) counts through slice 41, to 4,200 ms.
        let mut c = finagle_budget(1, 0, 500_000);
        c.handle_request(ms(0));
        c.handle_request(ms(3_203));
        c.handle_request(ms(4_004));
        assert!(c.can_retry(ms(4_199)));
        assert!(
            !c.can_retry(ms(4_200)),
            "slice 32 stops counting at slice 42"
        );
    }

    #[test]
    fn tower_tps_empty_leaky_and_reserve() {
        // tower-rs/tower, tps_budget.rs, tests `tps_empty`, `tps_leaky`, `tps_reserve`.
        let mut empty = finagle_budget(1, 0, 1_000_000);
        assert!(!empty.try_withdraw(ms(0)), "tps_empty");
        let mut leaky = finagle_budget(1, 0, 1_000_000);
        leaky.handle_request(ms(0));
        assert!(
            !leaky.try_withdraw(ms(3_000)),
            "tps_leaky: 3 s later the deposit is gone"
        );
        // tps_reserve: TTL 1 s, 5 retries per second: five withdrawals, then none.
        let mut reserve = finagle_budget(1, 5, 1_000_000);
        for _ in 0..5 {
            assert!(reserve.try_withdraw(ms(0)));
        }
        assert!(!reserve.try_withdraw(ms(0)));
        // The reserve is never consumed: the five withdrawals expire one TTL later.
        assert!(!reserve.can_retry(ms(999)));
        assert_eq!(reserve.balance(ms(1_000)), 5);
    }

    /// Finagle's `RetryBudgetTest.testBudget`: with time frozen, `nReqs` rounds of one deposit
    /// and one attempted withdrawal retry `nReqs · percentCanRetry + ttl · minRetriesPerSec`
    /// times (Finagle allows ±1 for its scale factor; ours is exact), and a refused
    /// withdrawal leaves a zero balance.
    fn finagle_test_budget(ttl_secs: u64, min_per_sec: u32, ppm: u32) -> u64 {
        let mut b = finagle_budget(ttl_secs, min_per_sec, ppm);
        let now = ms(5);
        assert_eq!(b.balance(now), ttl_secs * u64::from(min_per_sec));
        let mut retried = 0;
        for _ in 0..10_000 {
            b.handle_request(now);
            if b.try_withdraw(now) {
                retried += 1;
            } else {
                assert_eq!(b.balance(now), 0);
            }
        }
        retried
    }

    #[test]
    #[cfg_attr(miri, ignore)] // 150 000 requests: minutes under miri
    fn finagle_retry_budget_test_numbers() {
        // twitter/finagle, finagle-core/src/test/scala/com/twitter/finagle/service/
        // RetryBudgetTest.scala, "apply minRetriesPerSec=0" (TTL 60 s): 10,000 requests.
        for (ppm, want) in [
            (100_000, 1_000),
            (500_000, 5_000),
            (250_000, 2_500),
            (750_000, 7_500),
            (990_000, 9_900),
            (999_000, 9_990),
            (999_900, 9_999),
            (10_000, 100),
            (1_000, 10),
            (100, 1),
        ] {
            assert_eq!(finagle_test_budget(60, 0, ppm), want, "{ppm} ppm");
        }
        // "apply with minRetries and maxPercentOver=0" and "… and maxPercentOver".
        assert_eq!(finagle_test_budget(1, 10, 0), 10);
        assert_eq!(finagle_test_budget(2, 5, 0), 10);
        assert_eq!(finagle_test_budget(1, 10, 100_000), 1_000 + 10);
        assert_eq!(finagle_test_budget(2, 5, 500_000), 5_000 + 10);
        // "apply minRetries=0 maxPercentOver greater than 1.0": 200 %, 10,000 deposits.
        let mut b = finagle_budget(60, 0, 2_000_000);
        assert!(!b.try_withdraw(ms(0)));
        for _ in 0..10_000 {
            b.handle_request(ms(0));
        }
        assert_eq!(b.balance(ms(0)), 20_000);
    }

    /// A deposit's life in one scenario, at any TTL and any epoch: answers at fixed fractions
    /// of the TTL after the anchor.
    fn lifetime_answers(ttl_secs: u64, epoch: Instant) -> [bool; 6] {
        let ttl = Duration::from_secs(ttl_secs);
        let at = |tenths_x100: u32| epoch + ttl * tenths_x100 / 1_000;
        let mut b = finagle_budget(ttl_secs, 0, 1_000_000);
        b.handle_request(epoch); // the first deposit: the anchor
        assert!(
            b.try_withdraw(epoch),
            "and withdrawn at once: the balance is back to 0"
        );
        b.handle_request(at(95)); // in slice 0 (0.095 TTL)
        let mut late = b.clone();
        late.handle_request(at(950)); // in slice 9
        [
            b.can_retry(at(999)),       // 0.999 TTL: still counts
            b.can_retry(at(1_000)),     // one TTL after the anchor: gone (lived 0.905 TTL)
            late.can_retry(at(1_899)),  // the slice-9 deposit still counts
            late.can_retry(at(1_900)),  // gone after 0.95 TTL
            late.can_retry(at(1_000)),  // only the slice-9 one is left
            late.balance(at(950)) == 2, // both at 0.95 TTL
        ]
    }

    #[test]
    fn outcomes_before_the_first_request_do_not_move_the_grid() {
        // TTL 1 s, no reserve, 50 %: two requests at 950 ms make one retry. Anchored at the
        // first request, their slice ends at 1,950 ms; had the failure at 0 ms set the grid,
        // they would have expired at 1,900 ms.
        let plain = |before: Option<fn(&mut FinagleBudget, Instant)>| {
            let mut b = finagle_budget(1, 0, 500_000);
            if let Some(f) = before {
                f(&mut b, ms(0));
            }
            assert_eq!(b.anchor(), None, "nothing entered the window: no anchor");
            b.handle_request(ms(950));
            b.handle_request(ms(950));
            assert_eq!(b.anchor(), Some(ms(950)));
            (b.can_retry(ms(1_920)), b.can_retry(ms(1_950)))
        };
        let want = (true, false);
        assert_eq!(plain(None), want);
        assert_eq!(plain(Some(|b, at| b.handle_failure(at))), want);
        assert_eq!(plain(Some(|b, at| b.handle_success(at))), want);
        // A refused withdrawal (empty window, no reserve) puts nothing in the window either.
        assert_eq!(plain(Some(|b, at| assert!(!b.try_withdraw(at)))), want);
    }

    #[test]
    fn finagle_behaves_the_same_at_ttl_1_10_and_60_s_whatever_the_epoch() {
        let want = [true, false, true, false, true, true];
        for ttl in [1, 10, 60] {
            for epoch in [
                Instant::ZERO,
                Instant::from_nanos(1),
                ms(999),
                Instant::from_nanos(123_456_789_012),
                Instant::from_nanos(1 << 62),
            ] {
                assert_eq!(
                    lifetime_answers(ttl, epoch),
                    want,
                    "TTL {ttl} s, epoch {epoch:?}"
                );
            }
        }
    }

    #[test]
    fn finagle_deposits_live_more_than_nine_tenths_and_at_most_one_ttl() {
        // At TTL 1 s a deposit at x.999 s (issue 15: it lived 1 ms in whole-second slots)
        // now lives 0.9 s to 1 s, wherever the anchor is.
        // Under miri only the issue's anchor: each of the ~1,000 probes is slow there.
        let anchors: &[u64] = if cfg!(miri) {
            &[999]
        } else {
            &[0, 1, 500, 999]
        };
        for &anchor_ms in anchors {
            let mut b = finagle_budget(1, 0, 1_000_000);
            b.handle_success(ms(anchor_ms));
            b.handle_request(ms(2_999));
            let born = ms(2_999);
            let mut life = Duration::ZERO;
            while b.can_retry(born + life) {
                life += Duration::from_millis(1);
            }
            assert!(
                life > Duration::from_millis(900) && life <= Duration::from_secs(1),
                "anchor {anchor_ms} ms: lived {life:?}"
            );
        }
    }

    #[test]
    fn grpc_replacement_keeps_the_token_fraction() {
        // grpc/grpc, test/core/client_channel/retry_throttle_test.cc,
        // `ServerRetryThrottleData.Replacement` (code: src/core/client_channel/
        // retry_throttle.cc scales the old count by new_max / old_max). Old: max 4, ratio 1.
        let mut t = GrpcThrottle::new(
            GrpcThrottleConfig::default()
                .with_max_tokens(4)
                .with_milli_token_ratio(1_000),
        )
        .unwrap();
        t.handle_failure(T0); // 3 tokens: above the threshold of 2
        assert!(t.can_retry(T0));
        // New: max 10 (threshold 5), ratio 3; "token_count starts at 7.5".
        t.set_config(
            GrpcThrottleConfig::default()
                .with_max_tokens(10)
                .with_milli_token_ratio(3_000),
        )
        .unwrap();
        assert_eq!(t.milli_tokens(), 7_500);
        let fail = |t: &mut GrpcThrottle| {
            t.handle_failure(T0);
            t.can_retry(T0)
        };
        assert!(fail(&mut t), "6.5");
        assert!(fail(&mut t), "5.5");
        assert!(!fail(&mut t), "4.5: below the threshold");
        assert!(!fail(&mut t), "3.5");
        t.handle_success(T0);
        assert_eq!(t.milli_tokens(), 6_500, "a success adds the new ratio, 3");
        assert!(fail(&mut t), "5.5");
        assert!(!fail(&mut t), "4.5");
    }

    #[test]
    fn grpc_replacement_rounds_down_and_refuses_an_invalid_config() {
        let mut t = GrpcThrottle::new(GrpcThrottleConfig::default().with_max_tokens(3)).unwrap();
        t.handle_failure(T0);
        t.handle_failure(T0); // 1 of 3 tokens
        t.set_config(GrpcThrottleConfig::default().with_max_tokens(10))
            .unwrap();
        assert_eq!(t.milli_tokens(), 3_333, "10/3 tokens, rounded down");
        let before = t.clone();
        assert!(
            t.set_config(GrpcThrottleConfig::default().with_max_tokens(0))
                .is_err()
        );
        assert_eq!(t, before, "a refused config changes nothing");
        // Full stays full, at the largest maximum too.
        let mut full = GrpcThrottle::default();
        full.set_config(GrpcThrottleConfig::default().with_max_tokens(1_000))
            .unwrap();
        assert_eq!(full.milli_tokens(), 1_000_000);
        assert_eq!(full.config().max_tokens(), 1_000);
    }

    #[test]
    fn aws_standard_quota_numbers() {
        // "Retry behavior" (AWS SDKs and Tools reference guide), standard mode's retry quota;
        // smithy-rs `TokenBucket` constants DEFAULT_CAPACITY = 500, RETRY_COST = 5,
        // RETRY_TIMEOUT_COST = RETRY_COST * 2, PERMIT_REGENERATION_AMOUNT = 1.
        use ErrorCause::{Throttling, Timeout, Transient};
        let mut q = AwsRetryQuota::default();
        assert_eq!(q.tokens(), 500);
        let mut n = 0;
        while q.try_withdraw_for(T0, Transient) {
            n += 1;
        }
        assert_eq!((n, q.tokens()), (100, 0), "500 / 5");
        let mut q = AwsRetryQuota::default();
        let mut n = 0;
        while q.try_withdraw_for(T0, Timeout) {
            n += 1;
        }
        assert_eq!(n, 50, "500 / 10 after timeouts");
        // 5 tokens left: a timeout retry (10) is refused and takes nothing; others go.
        let mut q = AwsRetryQuota::default();
        for _ in 0..99 {
            assert!(q.try_withdraw_for(T0, Transient));
        }
        assert_eq!(q.tokens(), 5);
        assert!(!q.can_retry_for(T0, Timeout));
        assert!(!q.try_withdraw_for(T0, Timeout));
        assert_eq!(q.tokens(), 5);
        assert!(q.can_retry_for(T0, Throttling));
        assert!(
            q.try_withdraw(T0),
            "the plain withdrawal prices a transient error"
        );
        assert!(!q.can_retry(T0));
        // A success on a retry refunds its cost; one at the first attempt adds 1.
        q.handle_retry_success(T0, Timeout);
        assert_eq!(q.tokens(), 10);
        q.handle_success(T0);
        assert_eq!(q.tokens(), 11);
        // Failures and requests change nothing.
        q.handle_failure(T0);
        q.handle_request(T0);
        assert_eq!(q.tokens(), 11);
        // Never above the maximum (aws-sdk-js-v3 `releaseRetryTokens` caps the same way).
        let mut full = AwsRetryQuota::default();
        full.handle_success(T0);
        full.handle_retry_success(T0, Timeout);
        assert_eq!(full.tokens(), 500);
    }

    #[test]
    fn aws_2026_quota_prices_throttling_below_other_errors() {
        // AWS_NEW_RETRIES_2026 (aws/aws-sdk-go-v2 "retries 2026" preview, AWS "Retry
        // behavior"): a non-throttling retry costs 14, timeouts included; throttling 5.
        use ErrorCause::{Throttling, Timeout, Transient};
        let cfg = AwsRetryQuotaConfig::aws_standard_2026();
        assert_eq!(
            (cfg.cost(Transient), cfg.cost(Timeout), cfg.cost(Throttling)),
            (14, 14, 5)
        );
        let mut q = AwsRetryQuota::new(cfg);
        let mut n = 0;
        while q.try_withdraw_for(T0, Timeout) {
            n += 1;
        }
        assert_eq!((n, q.tokens()), (35, 10), "35 · 14 = 490");
        assert!(q.try_withdraw_for(T0, Throttling));
        assert!(q.try_withdraw_for(T0, Throttling));
        assert!(!q.try_withdraw_for(T0, Throttling));
        // Custom costs, and a free retry.
        let mut free = AwsRetryQuota::new(AwsRetryQuotaConfig::default().with_max_tokens(0));
        assert!(!free.can_retry(T0));
        free = AwsRetryQuota::new(
            AwsRetryQuotaConfig::default()
                .with_max_tokens(0)
                .with_retry_cost(0)
                .with_no_retry_increment(7),
        );
        assert!(free.try_withdraw(T0));
        free.handle_success(T0);
        assert_eq!(free.tokens(), 0, "capped at a zero maximum");
        assert_eq!(free.config().validate(), Ok(()));
    }

    #[test]
    fn the_default_trait_methods_keep_the_cause_blind_budgets_as_they_were() {
        // gRPC: the cause changes nothing, and a success on a retry earns the ratio.
        let mut g = GrpcThrottle::default();
        g.handle_failure(T0);
        assert!(g.try_withdraw_for(T0, ErrorCause::Timeout));
        g.handle_retry_success(T0, ErrorCause::Timeout);
        assert_eq!(g.milli_tokens(), 9_100);
        let mut f = finagle_budget(1, 1, 0);
        assert!(f.can_retry_for(T0, ErrorCause::Throttling));
        assert!(f.try_withdraw_for(T0, ErrorCause::Throttling));
        assert!(!f.try_withdraw_for(T0, ErrorCause::Transient));
        let b: &mut dyn RetryBudget = &mut AwsRetryQuota::default();
        assert!(b.try_withdraw_for(T0, ErrorCause::Timeout), "object safe");
    }

    fn secs(s: u64) -> Instant {
        Instant::from_millis(s * 1_000)
    }
}
