//! The gate's configuration: the built-in reasons' delay sources and the reason registry.

use core::fmt;
use core::time::Duration;

use smallvec::SmallVec;

use crate::backoff::BackoffConfig;
use crate::backpressure::ThrottleCurve;
use crate::error::ConfigError;
use crate::options::{ConfigOption, write_gate as opt};

/// Why a bucket is gated: an index into the gate's reason registry.
///
/// The three built-ins have fixed indices; custom reasons get the next ones, in registration
/// order, from [`WriteGateConfig::register`]. Lower indices win ties in
/// [`WriteGate::explain`](super::WriteGate::explain) and [`GateState::Closed`](super::GateState).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Reason(u8);

impl Reason {
    /// The server's disk protection rejected a write (`DISK_WRITE_LOCKED`). Never-shorten.
    pub const DISK_WRITE_LOCKED: Reason = Builtin::DiskWriteLocked.reason();
    /// The KV server reported backpressure. Latest-wins; dropped when the leader is unknown.
    pub const KV_BACKPRESSURE: Reason = Builtin::KvBackpressure.reason();
    /// A write failed with another retriable error. Never-shorten.
    pub const RETRIABLE_WRITE: Reason = Builtin::RetriableWrite.reason();

    /// The reason's index in the registry (and in each bucket's deadline array).
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Builtin::ALL.get(self.index()) {
            Some(builtin) => f.write_str(builtin.debug_name()),
            None => write!(f, "Custom({})", self.0),
        }
    }
}

/// The built-in reasons. Each match on them is exhaustive (no `_` arm), so a new built-in
/// stops the build at each place that must describe it; `docs/architecture.md` lists the
/// places the compiler cannot point at (its input method and delay source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Builtin {
    DiskWriteLocked,
    KvBackpressure,
    RetriableWrite,
}

impl Builtin {
    /// Every built-in, at its fixed index (append only: indices are public).
    pub(super) const ALL: [Builtin; 3] = [
        Builtin::DiskWriteLocked,
        Builtin::KvBackpressure,
        Builtin::RetriableWrite,
    ];

    /// The built-in's handle, at its fixed index.
    const fn reason(self) -> Reason {
        Reason(match self {
            Builtin::DiskWriteLocked => 0,
            Builtin::KvBackpressure => 1,
            Builtin::RetriableWrite => 2,
        })
    }

    /// How `Reason`'s `Debug` shows it.
    const fn debug_name(self) -> &'static str {
        match self {
            Builtin::DiskWriteLocked => "DiskWriteLocked",
            Builtin::KvBackpressure => "KvBackpressure",
            Builtin::RetriableWrite => "RetriableWrite",
        }
    }

    /// Its entry in every registry.
    fn spec(self) -> ReasonSpec {
        match self {
            Builtin::DiskWriteLocked => {
                ReasonSpec::new("disk-write-locked", UpdateRule::NeverShorten)
            }
            Builtin::KvBackpressure => {
                ReasonSpec::new("kv-backpressure", UpdateRule::LatestWins).leader_scoped(true)
            }
            Builtin::RetriableWrite => ReasonSpec::new("retriable-write", UpdateRule::NeverShorten),
        }
    }
}

// `Builtin::ALL` lists every built-in at its index, so `Debug` and the registry agree.
const _: () = {
    let mut i = 0;
    while i < Builtin::ALL.len() {
        assert!(Builtin::ALL[i].reason().index() == i);
        i += 1;
    }
};

/// How a new install for a reason combines with the deadline that reason already has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpdateRule {
    /// Keep the later of the pending deadline and the new one (backoffs: a shorter, later
    /// rejection must not cut a longer backoff short). A zero install changes nothing.
    NeverShorten,
    /// The newest install replaces the deadline, shortening it or (zero) clearing it
    /// (pressure signals: the server's latest word is the truth).
    LatestWins,
}

/// One entry of the reason registry: a name, an update rule and options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReasonSpec {
    name: &'static str,
    rule: UpdateRule,
    leader_scoped: bool,
    probe_sends: Option<u32>,
    probe_ttl: Duration,
}

impl ReasonSpec {
    /// A reason named `name` (for diagnostics) combining installs by `rule`; not leader-scoped,
    /// no probe mode.
    pub const fn new(name: &'static str, rule: UpdateRule) -> Self {
        ReasonSpec {
            name,
            rule,
            leader_scoped: false,
            probe_sends: None,
            probe_ttl: DEFAULT_PROBE_TTL,
        }
    }

    /// Whether the throttle belongs to the current leader: it is dropped when the leader
    /// becomes unknown, and installs are ignored while it is unknown (KV backpressure is).
    pub const fn leader_scoped(mut self, scoped: bool) -> Self {
        self.leader_scoped = scoped;
        self
    }

    /// Probe mode: once this reason's deadline has passed, only `sends` sends are allowed
    /// until a success or a new rejection re-gates the bucket (a never-shorten install, or an
    /// install of this reason if it is latest-wins). `None` disables it.
    /// Zero is refused by [`WriteGateConfig::register`].
    pub const fn probe(mut self, sends: Option<u32>) -> Self {
        self.probe_sends = sends;
        self
    }

    /// How long a probe state outlives the bucket's gates: `ttl` after the bucket last opened
    /// (its last deadline passed or was lifted) with no success and no new rejection, the
    /// probe state lapses, the bucket is `Open` again and its entry is evicted. Bounds the
    /// state of buckets rejected once and never written again. Default
    /// [`DEFAULT_PROBE_TTL`] (10 min). With several armed reasons the longest ttl applies.
    pub const fn probe_ttl(mut self, ttl: Duration) -> Self {
        self.probe_ttl = ttl;
        self
    }

    /// The probe state's time to live after the bucket opened (see [`Self::probe_ttl`]).
    pub const fn probe_time_to_live(&self) -> Duration {
        self.probe_ttl
    }

    /// The name given at registration.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The update rule.
    pub const fn rule(&self) -> UpdateRule {
        self.rule
    }

    /// Whether the reason is dropped with the leader.
    pub const fn is_leader_scoped(&self) -> bool {
        self.leader_scoped
    }

    /// The probe allowance, if probe mode is on.
    pub const fn probe_sends(&self) -> Option<u32> {
        self.probe_sends
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.check_probe(&opt::PROBE_SENDS)
    }

    /// Refuses a zero probe allowance, reported as `option` (the method that set it).
    fn check_probe(&self, option: &'static ConfigOption) -> Result<(), ConfigError> {
        if self.probe_sends == Some(0) {
            return Err(ConfigError::OutOfRange {
                option,
                got: 0,
                min: 1,
                max: u32::MAX as u64,
                unit: "sends",
            });
        }
        Ok(())
    }
}

/// How long an unanswered probe state lasts after the bucket opened, unless
/// [`ReasonSpec::probe_ttl`] says otherwise: 10 minutes, long past any backoff (the disk
/// backoff caps at 10 s) yet short enough that buckets rejected once and then abandoned
/// (moved, dropped table) do not accumulate.
pub const DEFAULT_PROBE_TTL: Duration = Duration::from_secs(600);

/// The most reasons one gate can hold (each bucket keeps one armed-probe bit per reason).
pub const MAX_REASONS: usize = 64;

/// Reasons kept inline in each bucket without a heap allocation: the built-ins plus one.
pub(super) const INLINE_REASONS: usize = 4;

/// Configuration of a [`WriteGate`](super::WriteGate).
///
/// `Default` takes each built-in reason's numbers from the Fluss client that has them. No
/// single Fluss client has all three today, so it is a composition, part by part:
///
/// - `DISK_WRITE_LOCKED`: [`BackoffConfig::fluss_disk_write_locked`], 1 s → 10 s, ×2, ±20 %:
///   the Java client's `client.writer.disk-write-locked.backoff` / `-backoff-max` from Fluss
///   PR #4293 (open; its `WriteThrottleController` is what this gate is). The Rust client has
///   no such backoff.
/// - `KV_BACKPRESSURE`: [`ThrottleCurve::default`], `max_throttle · p²` with
///   `max_throttle` = 3000 ms: the KV backpressure Fluss PR #3463 landed (Java
///   `client.writer.kv-backpressure.max-throttle`; the Rust client's
///   `writer_kv_backpressure_max_throttle_ms`, same default), which pairs with the landed
///   server, [`PressureConfig::default`](crate::backpressure::PressureConfig::default)
///   (`Tf = 8`).
/// - `RETRIABLE_WRITE`: [`BackoffConfig::fluss_retriable_write`], 100 ms → 1 s, ×2, ±20 %: the
///   Rust client's `writer_retry_backoff_ms` / `writer_retry_max_backoff_ms` (defaults 100 and
///   1000) from Fluss PR #4403 (merged 2026-09-17, closing issue #4402), whose numbers are the
///   Kafka producer's `retry.backoff.ms` / `retry.backoff.max.ms`. The Java client has no
///   such backoff (it re-enqueues a retriable failure at once).
/// - no custom reasons and no probe mode (probe mode is not in PR #4293; it was a review
///   suggestion there).
///
/// The proposal of Fluss issue #3454 (cubic, 5000 ms) is the preset
/// [`WriteGateConfig::fluss_issue_3454`]; `docs/write-gate.md` says why the default's curve is
/// the landed one.
///
/// ```
/// use throttle_sansio::write_gate::{ReasonSpec, UpdateRule, WriteGateConfig};
/// let mut cfg = WriteGateConfig::default();
/// let quota = cfg
///     .register(ReasonSpec::new("quota", UpdateRule::LatestWins).probe(Some(2)))
///     .unwrap();
/// assert_eq!(quota.index(), 3);
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WriteGateConfig {
    pub(super) disk_write_locked: BackoffConfig,
    pub(super) retriable_write: BackoffConfig,
    pub(super) kv_curve: ThrottleCurve,
    /// KV jitter, ± this many ppm of the curve's delay (0: none).
    pub(super) kv_jitter_ppm: u32,
    /// The registered KV hard-rejection reason, if the never-shorten rule is on.
    kv_hard: Option<Reason>,
    /// Wake coalescing: `poll_timeout` is the earliest opening plus this (zero: none).
    pub(super) wake_slack: Duration,
    reasons: SmallVec<[ReasonSpec; INLINE_REASONS]>,
}

impl Default for WriteGateConfig {
    /// Per reason, the Fluss client that has it: PR #4293's disk backoff, PR #3463's landed KV
    /// curve, PR #4403's retriable-write backoff (see the type's docs).
    fn default() -> Self {
        let reasons = Builtin::ALL.iter().map(|b| b.spec()).collect();
        WriteGateConfig {
            disk_write_locked: BackoffConfig::fluss_disk_write_locked(),
            retriable_write: BackoffConfig::fluss_retriable_write(),
            kv_curve: ThrottleCurve::default(),
            kv_jitter_ppm: 0,
            kv_hard: None,
            wake_slack: Duration::ZERO,
            reasons,
        }
    }
}

/// The largest KV jitter [`WriteGateConfig::with_kv_jitter`] accepts: ±50 % (500 000 ppm), so
/// a jittered throttle keeps at least half of the curve's delay.
pub const MAX_KV_JITTER_PPM: u32 = 500_000;

/// The largest wake slack [`WriteGateConfig::with_wake_slack`] accepts: 60 s. Far past any
/// useful coalescing window (the disk backoff caps at 10 s); a larger value is taken for a unit
/// mistake and refused.
pub const MAX_WAKE_SLACK: Duration = Duration::from_secs(60);

/// Refuses a wake slack above [`MAX_WAKE_SLACK`], naming `option` (the gate's, or the paced
/// writer's, which replaces it).
pub(crate) fn check_wake_slack(
    option: &'static ConfigOption,
    slack: Duration,
) -> Result<(), ConfigError> {
    if slack > MAX_WAKE_SLACK {
        return Err(ConfigError::OutOfRange {
            option,
            got: u64::try_from(slack.as_millis()).unwrap_or(u64::MAX),
            min: 0,
            max: MAX_WAKE_SLACK.as_secs() * 1_000,
            unit: "ms",
        });
    }
    Ok(())
}

/// The name of the reason [`WriteGateConfig::with_kv_hard_rejection_never_shorten`] registers.
pub const KV_HARD_REJECTION_NAME: &str = "kv-hard-rejection";

impl WriteGateConfig {
    /// The default backoffs with the KV curve proposed in Fluss issue #3454,
    /// [`ThrottleCurve::fluss_issue_3454`] (`k = 3`, 5000 ms); pair it with
    /// [`PressureConfig::fluss_issue_3454`](crate::backpressure::PressureConfig::fluss_issue_3454)
    /// (`Tf = 12`) on the server.
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::backpressure::{Signal, ThrottleCurve};
    /// use throttle_sansio::write_gate::WriteGateConfig;
    ///
    /// let proposal = WriteGateConfig::fluss_issue_3454();
    /// assert_eq!(proposal.kv_curve().delay(Signal::Pressure(500_000)), Duration::from_millis(625));
    /// // The default is the landed curve: 3000 ms · 0.5² = 750 ms.
    /// let landed = WriteGateConfig::default();
    /// assert_eq!(landed.kv_curve(), &ThrottleCurve::fluss_landed());
    /// assert_eq!(landed.kv_curve().delay(Signal::Pressure(500_000)), Duration::from_millis(750));
    /// ```
    pub fn fluss_issue_3454() -> Self {
        Self::default().with_kv_curve(ThrottleCurve::fluss_issue_3454())
    }

    /// The whole gate as Fluss has it, pinned: unlike [`Default`], which may change, this
    /// preset keeps these numbers.
    ///
    /// - `DISK_WRITE_LOCKED`: [`BackoffConfig::fluss_disk_write_locked`] (1 s → 10 s, ×2,
    ///   ±20 %, the Java keys `client.writer.disk-write-locked.backoff` / `-backoff-max` of
    ///   Fluss PR #4293);
    /// - `RETRIABLE_WRITE`: [`BackoffConfig::fluss_retriable_write`] (100 ms → 1 s, ×2, ±20 %,
    ///   the Rust client's `writer_retry_backoff_ms` / `writer_retry_max_backoff_ms`, PR #4403);
    /// - `KV_BACKPRESSURE`: [`ThrottleCurve::fluss_landed`], `3000 ms · p²` truncated to whole
    ///   milliseconds, the Java client's `updateThrottle` (PR #3463), with its rule: every KV
    ///   response replaces the bucket's throttle (latest wins), a hard rejection
    ///   ([`Signal::Full`](crate::backpressure::Signal::Full), the Java client's internal
    ///   `1.0f`) included, and no jitter.
    ///
    /// Today it equals [`WriteGateConfig::default`]. The KV rule that Fluss's review of PR
    /// #4403 asked for (a hard rejection is never shortened) is opt-in:
    /// [`Self::with_kv_hard_rejection_never_shorten`].
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::backoff::BackoffConfig;
    /// use throttle_sansio::backpressure::{Signal, ThrottleCurve};
    /// use throttle_sansio::write_gate::WriteGateConfig;
    ///
    /// let landed = WriteGateConfig::fluss_landed();
    /// assert_eq!(landed.kv_curve(), &ThrottleCurve::fluss_landed());
    /// assert_eq!(landed.disk_write_locked(), &BackoffConfig::fluss_disk_write_locked());
    /// assert_eq!(landed.retriable_write(), &BackoffConfig::fluss_retriable_write());
    /// assert_eq!(landed.kv_curve().delay(Signal::Pressure(500_000)), Duration::from_millis(750));
    /// assert_eq!(landed.kv_hard_rejection(), None); // latest wins, as in the Java client
    /// assert_eq!(landed.kv_jitter_ppm(), 0);
    /// ```
    pub fn fluss_landed() -> Self {
        let reasons = Builtin::ALL.iter().map(|b| b.spec()).collect();
        WriteGateConfig {
            disk_write_locked: BackoffConfig::fluss_disk_write_locked(),
            retriable_write: BackoffConfig::fluss_retriable_write(),
            kv_curve: ThrottleCurve::fluss_landed(),
            kv_jitter_ppm: 0,
            kv_hard: None,
            wake_slack: Duration::ZERO,
            reasons,
        }
    }

    /// Jitter on KV throttles: [`WriteGate::handle_kv_signal_jittered`](super::WriteGate::handle_kv_signal_jittered)
    /// draws each throttle uniformly from `delay · (1 ± ppm / 10⁶)` (whole nanoseconds,
    /// from the caller's generator), so buckets throttled by one response do not reopen in
    /// the same instant. `0` (the default) turns it off. At most [`MAX_KV_JITTER_PPM`]
    /// (±50 %); a larger value is refused by [`Self::validate`] and the gate's constructor.
    /// [`WriteGate::handle_kv_signal`](super::WriteGate::handle_kv_signal) takes no generator
    /// and installs the curve's delay as is. The paced writer (and so `sync::WriteDriver`)
    /// feeds every KV response through the jittered input, so the option applies there.
    ///
    /// ```
    /// use throttle_sansio::write_gate::WriteGateConfig;
    /// assert!(WriteGateConfig::default().with_kv_jitter(200_000).validate().is_ok());
    /// assert!(WriteGateConfig::default().with_kv_jitter(500_001).validate().is_err());
    /// ```
    #[must_use]
    pub fn with_kv_jitter(mut self, ppm: u32) -> Self {
        self.kv_jitter_ppm = ppm;
        self
    }

    /// Wake coalescing (timer slack): [`WriteGate::poll_timeout`](super::WriteGate::poll_timeout)
    /// answers `d + slack`, where `d` is the earliest opening among the gated buckets, so one
    /// wake-up serves every bucket that opens within `slack` after the first. A pass at `t`
    /// still evicts and opens exactly the buckets whose deadline is `≤ t`: no bucket opens
    /// before its deadline, and a loop that sleeps until `poll_timeout` lets none wait more
    /// than `slack` past it (the runtime timer's own lateness aside). Zero, the default of
    /// every preset, is the exact timing of the machine without coalescing. At most
    /// [`MAX_WAKE_SLACK`]; a larger value is refused by [`Self::validate`]. The paced writer
    /// sets its own ([`PacedWriterConfig::with_wake_slack`](crate::paced_writer::PacedWriterConfig::with_wake_slack)).
    ///
    /// Coalescing is what a loop that sleeps until `poll_timeout` gets (a single-owner sender
    /// with [`GateTimer`](super::GateTimer), the paced writer). The `sync` layer's
    /// `GateHandle::wait_until_open` (and the tower gate layer on it) waits for each bucket's
    /// own opening, exactly: there the slack only delays when `drive_timeouts` evicts expired
    /// state.
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::write_gate::WriteGateConfig;
    /// let cfg = WriteGateConfig::default().with_wake_slack(Duration::from_millis(50));
    /// assert_eq!(cfg.wake_slack(), Duration::from_millis(50));
    /// assert!(cfg.validate().is_ok());
    /// assert!(WriteGateConfig::default().with_wake_slack(Duration::from_secs(61)).validate().is_err());
    /// ```
    #[must_use]
    pub fn with_wake_slack(mut self, slack: Duration) -> Self {
        self.wake_slack = slack;
        self
    }

    /// The wake slack (see [`Self::with_wake_slack`]).
    pub fn wake_slack(&self) -> Duration {
        self.wake_slack
    }

    /// The KV jitter in ppm (see [`Self::with_kv_jitter`]).
    pub fn kv_jitter_ppm(&self) -> u32 {
        self.kv_jitter_ppm
    }

    /// A KV hard rejection ([`Signal::Full`](crate::backpressure::Signal::Full): the server
    /// rejected the write, Java's `StorageBackpressureException`) holds its bucket for the
    /// curve's whole ceiling, and later KV responses can only lengthen that hold: a
    /// low-pressure or `Clear` response that arrives before it ends no longer cuts it short
    /// (the "last one wins" defect found in the review of Fluss PR #4403).
    ///
    /// It registers a reason named [`KV_HARD_REJECTION_NAME`] (never-shorten, leader-scoped,
    /// like [`Reason::KV_BACKPRESSURE`] dropped when the leader becomes unknown) at the next
    /// free index, as [`Self::register`] would: [`Self::kv_hard_rejection`] returns it, and
    /// [`GateState::Closed`](super::GateState::Closed) names it while a hard rejection
    /// dominates. Pressure signals stay latest-wins on `KV_BACKPRESSURE`. Calling it again
    /// changes nothing. Without it (the default and [`Self::fluss_landed`]), a hard
    /// rejection is one more latest-wins KV install, as in the Java client's
    /// `updateThrottle`.
    ///
    /// Refused (nothing added) when the registry is full ([`MAX_REASONS`]).
    ///
    /// ```
    /// use throttle_sansio::write_gate::WriteGateConfig;
    /// let cfg = WriteGateConfig::default().with_kv_hard_rejection_never_shorten()?;
    /// let hard = cfg.kv_hard_rejection().expect("registered");
    /// assert_eq!(hard.index(), 3);
    /// assert_eq!(cfg.reason(hard).map(|s| s.name()), Some("kv-hard-rejection"));
    /// # Ok::<(), throttle_sansio::ConfigError>(())
    /// ```
    pub fn with_kv_hard_rejection_never_shorten(mut self) -> Result<Self, ConfigError> {
        if self.kv_hard.is_none() {
            let spec = ReasonSpec::new(KV_HARD_REJECTION_NAME, UpdateRule::NeverShorten)
                .leader_scoped(true);
            self.kv_hard = Some(self.register(spec)?);
        }
        Ok(self)
    }

    /// The KV hard-rejection reason, if [`Self::with_kv_hard_rejection_never_shorten`]
    /// registered it (`None`: hard rejections are latest-wins KV installs).
    pub fn kv_hard_rejection(&self) -> Option<Reason> {
        self.kv_hard
    }

    /// Backoff for `DISK_WRITE_LOCKED` rejections (`client.writer.disk-write-locked.backoff`).
    #[must_use]
    pub fn with_disk_write_locked(mut self, backoff: BackoffConfig) -> Self {
        self.disk_write_locked = backoff;
        self
    }

    /// Backoff for other retriable write errors.
    #[must_use]
    pub fn with_retriable_write(mut self, backoff: BackoffConfig) -> Self {
        self.retriable_write = backoff;
        self
    }

    /// Pressure-to-delay curve for KV backpressure signals.
    #[must_use]
    pub fn with_kv_curve(mut self, curve: ThrottleCurve) -> Self {
        self.kv_curve = curve;
        self
    }

    /// The backoff for `DISK_WRITE_LOCKED` rejections.
    pub fn disk_write_locked(&self) -> &BackoffConfig {
        &self.disk_write_locked
    }

    /// The backoff for other retriable write errors.
    pub fn retriable_write(&self) -> &BackoffConfig {
        &self.retriable_write
    }

    /// The pressure-to-delay curve for KV backpressure signals.
    pub fn kv_curve(&self) -> &ThrottleCurve {
        &self.kv_curve
    }

    /// Add a custom reason; returns its handle for
    /// [`WriteGate::handle_throttle`](super::WriteGate::handle_throttle).
    ///
    /// Refused (nothing added) past [`MAX_REASONS`] or with a zero probe allowance.
    pub fn register(&mut self, spec: ReasonSpec) -> Result<Reason, ConfigError> {
        spec.validate()?;
        let index = self.reasons.len();
        let Ok(id) = u8::try_from(index) else {
            return Err(self.too_many());
        };
        if index >= MAX_REASONS {
            return Err(self.too_many());
        }
        self.reasons.push(spec);
        Ok(Reason(id))
    }

    /// Turn probe mode on (`Some(n)`, `n ≥ 1`) or off for a registered reason, built-ins
    /// included.
    pub fn set_probe(&mut self, reason: Reason, sends: Option<u32>) -> Result<(), ConfigError> {
        let Some(spec) = self.reasons.get_mut(reason.index()) else {
            return Err(ConfigError::Invalid {
                option: &opt::SET_PROBE,
                reason: "the reason is not registered",
            });
        };
        let updated = spec.probe(sends);
        updated.check_probe(&opt::SET_PROBE)?;
        *spec = updated;
        Ok(())
    }

    /// Set the [`ReasonSpec::probe_ttl`] of a registered reason, built-ins included.
    pub fn set_probe_ttl(&mut self, reason: Reason, ttl: Duration) -> Result<(), ConfigError> {
        let Some(spec) = self.reasons.get_mut(reason.index()) else {
            return Err(ConfigError::Invalid {
                option: &opt::SET_PROBE_TTL,
                reason: "the reason is not registered",
            });
        };
        *spec = spec.probe_ttl(ttl);
        Ok(())
    }

    /// The registered reasons, built-ins first, indexed by [`Reason::index`].
    #[inline]
    pub fn reasons(&self) -> &[ReasonSpec] {
        &self.reasons
    }

    /// The spec of `reason`, if registered.
    pub fn reason(&self, reason: Reason) -> Option<&ReasonSpec> {
        self.reasons.get(reason.index())
    }

    /// Check the registry (the setters already refuse bad values; this re-checks them all).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.reasons.len() > MAX_REASONS {
            return Err(self.too_many());
        }
        if self.kv_jitter_ppm > MAX_KV_JITTER_PPM {
            return Err(ConfigError::OutOfRange {
                option: &opt::KV_JITTER,
                got: u64::from(self.kv_jitter_ppm),
                min: 0,
                max: u64::from(MAX_KV_JITTER_PPM),
                unit: "ppm",
            });
        }
        check_wake_slack(&opt::WAKE_SLACK, self.wake_slack)?;
        self.reasons.iter().try_for_each(ReasonSpec::validate)
    }

    fn too_many(&self) -> ConfigError {
        ConfigError::OutOfRange {
            option: &opt::REASONS,
            got: self.reasons.len().saturating_add(1) as u64,
            min: Builtin::ALL.len() as u64,
            max: MAX_REASONS as u64,
            unit: "reasons",
        }
    }
}

/// A reason from its stored index (only indices of registered reasons are stored).
pub(super) const fn reason_from_u8(index: u8) -> Reason {
    Reason(index)
}
