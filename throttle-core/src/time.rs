//! Time: our own monotonic [`Instant`] and the saturating span arithmetic every machine uses.
//!
//! The core never reads a clock. The adapter picks an epoch (process start, say) and hands
//! every input `now` as nanoseconds since that epoch. All arithmetic saturates: `Instant::MAX`
//! plus anything is `Instant::MAX`, and a span that would be negative is zero.
//!
//! With feature `std`, [`StdEpoch`] is such an epoch on `std::time::Instant`, converted with
//! [`Instant::from_std`] and [`Instant::to_std`]: what a runtime without an async executor (a
//! thread loop over `poll_timeout`), or a client with its own sender task, needs. No runtime
//! crate is involved.
//!
//! The timeline must be **monotonic**: feed `std::time::Instant` (or a runtime's monotonic
//! clock), never wall-clock time. See [`Instant`] for what a wall clock's step does to a gate.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// A point on the one monotonic timeline, in nanoseconds from an epoch the adapter chooses.
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::Instant;
///
/// let t = Instant::from_nanos(1_000);
/// assert_eq!(t + Duration::from_nanos(500), Instant::from_nanos(1_500));
/// assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX); // saturates
/// assert_eq!(t - Instant::from_nanos(5_000), Duration::ZERO); // never negative
/// ```
///
/// # Wall-clock time freezes gates
///
/// Build instants from a **monotonic** clock: `Instant::from_std` of `std::time::Instant`
/// under feature `std` (`time::StdEpoch`), or a runtime's monotonic clock. Do not feed wall-clock
/// time (`SystemTime`, or `Instant::from_millis` of epoch milliseconds, as Fluss's
/// `System.currentTimeMillis()` throttles do): a wall clock steps when NTP or an operator
/// corrects it, and every machine keeps the **latest instant it has seen**, clamping an
/// earlier `now` to it (so a step never panics or shortens anything by itself). Hence:
///
/// - **A step backwards freezes the machines.** Every `now` after the step is clamped to the
///   instant before it, so for the machine no time passes until the wall clock has caught up
///   again: a bucket with 1 s left when the clock steps back 1 h opens 1 h 1 s later, and a
///   caller who sleeps until `reopens_at`/`poll_timeout` on its stepped-back wall clock
///   sleeps that long too (every deadline looks far away).
/// - **A step forwards expires everything early.** Every deadline before the new time has
///   passed at once, so every gated bucket opens and every backoff is over: the burst of
///   retries the gate exists to prevent. If the clock is then corrected back, the machines
///   freeze as above, now counting from the future instant they saw.
///
/// `tests/tests/clock_steps.rs` shows both on a [`WriteGate`](crate::WriteGate).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch itself.
    pub const ZERO: Instant = Instant(0);
    /// The last representable instant (about 584 years after the epoch).
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `nanos` nanoseconds after the epoch.
    #[inline]
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// The instant `millis` milliseconds after the epoch, saturating at [`Instant::MAX`].
    #[inline]
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the epoch.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + d`, or `None` if that is past [`Instant::MAX`].
    #[inline]
    pub fn checked_add(self, d: Duration) -> Option<Instant> {
        let n = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_add(n).map(Instant)
    }

    /// `self + d`, saturating at [`Instant::MAX`].
    #[inline]
    pub fn saturating_add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_to_nanos(d)))
    }

    /// `self - d`, or `None` if that is before the epoch.
    #[inline]
    pub fn checked_sub(self, d: Duration) -> Option<Instant> {
        let n = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_sub(n).map(Instant)
    }

    /// `self - d`, saturating at the epoch.
    #[inline]
    pub fn saturating_sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(duration_to_nanos(d)))
    }

    /// The span from `earlier` to `self`, or `None` if `earlier` is later.
    #[inline]
    pub fn checked_duration_since(self, earlier: Instant) -> Option<Duration> {
        self.0.checked_sub(earlier.0).map(Duration::from_nanos)
    }

    /// The span from `earlier` to `self`, or zero if `earlier` is later.
    #[inline]
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Instant({}ns)", self.0)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Saturating: see [`Instant::saturating_add`].
    #[inline]
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Instant {
    #[inline]
    fn add_assign(&mut self, d: Duration) {
        *self = self.saturating_add(d);
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    /// Saturating: see [`Instant::saturating_sub`].
    #[inline]
    fn sub(self, d: Duration) -> Instant {
        self.saturating_sub(d)
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating: see [`Instant::saturating_duration_since`].
    #[inline]
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

#[cfg(feature = "std")]
#[cfg_attr(docsrs, doc(cfg(feature = "std")))]
impl Instant {
    /// The core instant of the std instant `at` on `epoch`'s timeline: the nanoseconds from
    /// the epoch to `at`, saturating at [`Instant::ZERO`] for an `at` before the epoch and at
    /// [`Instant::MAX`] past about 584 years. What a custom runtime on `std::time` hands every
    /// input as `now`.
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::Instant;
    /// use throttle_sansio::time::StdEpoch;
    ///
    /// let epoch = StdEpoch::new();
    /// let later = epoch.epoch() + Duration::from_millis(1500);
    /// assert_eq!(Instant::from_std(epoch, later), Instant::from_millis(1500));
    /// assert_eq!(Instant::from_std(epoch, epoch.epoch()), Instant::ZERO);
    /// ```
    pub fn from_std(epoch: StdEpoch, at: std::time::Instant) -> Instant {
        let since = at.saturating_duration_since(epoch.epoch);
        Instant(duration_to_nanos(since))
    }

    /// The std instant of `self` on `epoch`'s timeline (for a deadline: `recv_timeout`,
    /// `thread::sleep`), or `None` if `std::time::Instant` cannot represent it on this
    /// platform. [`Instant::MAX`] may map to an instant centuries away rather than `None`:
    /// treat it as "never" before converting if that matters.
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::Instant;
    /// use throttle_sansio::time::StdEpoch;
    ///
    /// let epoch = StdEpoch::new();
    /// let deadline = Instant::from_millis(20);
    /// assert_eq!(deadline.to_std(epoch), Some(epoch.epoch() + Duration::from_millis(20)));
    /// ```
    pub fn to_std(self, epoch: StdEpoch) -> Option<std::time::Instant> {
        epoch.epoch.checked_add(Duration::from_nanos(self.0))
    }
}

/// The epoch of a core timeline on `std::time::Instant`: the std instant that is
/// [`Instant::ZERO`]. A runtime without an async executor (a thread loop, a test harness)
/// keeps one and converts with [`Instant::from_std`] / [`Instant::to_std`], or reads the
/// current core instant with [`now`](Self::now). `Copy`; every instant the machines see must
/// come from one epoch.
///
/// `std::time::Instant` is monotonic, which is the point: do not build an epoch-like
/// conversion on `SystemTime` (or hand the machines epoch milliseconds) instead. A wall clock
/// that steps backwards freezes every gate for the size of the step, because the machines
/// keep the latest instant they have seen and clamp earlier ones to it; one that steps
/// forwards expires every deadline at once. See [`Instant`]'s "Wall-clock time freezes gates".
///
/// ```
/// use throttle_sansio::Instant;
/// use throttle_sansio::time::StdEpoch;
///
/// let epoch = StdEpoch::new();
/// let t0 = epoch.now();
/// let t1 = epoch.now();
/// assert!(t1 >= t0); // monotonic, as `std::time::Instant` is
/// assert_eq!(Instant::from_std(epoch, epoch.epoch()), Instant::ZERO);
/// ```
#[cfg(feature = "std")]
#[cfg_attr(docsrs, doc(cfg(feature = "std")))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StdEpoch {
    epoch: std::time::Instant,
}

#[cfg(feature = "std")]
impl StdEpoch {
    /// An epoch at the current moment: its [`now`](Self::now) starts at [`Instant::ZERO`].
    pub fn new() -> Self {
        Self::at(std::time::Instant::now())
    }

    /// An epoch at the std instant `epoch`.
    pub const fn at(epoch: std::time::Instant) -> Self {
        StdEpoch { epoch }
    }

    /// The std instant that is [`Instant::ZERO`].
    pub const fn epoch(&self) -> std::time::Instant {
        self.epoch
    }

    /// The current core instant: [`Instant::from_std`] of `std::time::Instant::now()`.
    pub fn now(&self) -> Instant {
        Instant::from_std(*self, std::time::Instant::now())
    }
}

#[cfg(feature = "std")]
impl Default for StdEpoch {
    /// [`StdEpoch::new`]: an epoch at the current moment.
    fn default() -> Self {
        Self::new()
    }
}

/// A span in whole nanoseconds, saturating at `u64::MAX` (about 584 years).
#[inline]
pub(crate) fn duration_to_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A span in whole milliseconds, rounded **up**: a closed gate never reports 0 ms.
///
/// ```
/// use core::time::Duration;
/// assert_eq!(throttle_sansio::time::ceil_millis(Duration::from_nanos(1)), 1);
/// assert_eq!(throttle_sansio::time::ceil_millis(Duration::from_millis(7)), 7);
/// assert_eq!(throttle_sansio::time::ceil_millis(Duration::ZERO), 0);
/// ```
#[inline]
pub fn ceil_millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The latest time a machine has seen; clamps time that runs backwards.
///
/// Every machine keeps one and passes each input's `now` through [`Clock::observe`], so a
/// caller whose clock steps back sees the machine behave as if no time had passed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(dead_code)] // used by every machine module
pub(crate) struct Clock {
    last: Instant,
}

#[allow(dead_code)]
impl Clock {
    /// `max(now, last seen)`, remembering it.
    #[inline]
    pub(crate) fn observe(&mut self, now: Instant) -> Instant {
        if now > self.last {
            self.last = now;
        }
        self.last
    }

    /// `max(now, last seen)` without remembering it (for `&self` queries).
    #[inline]
    pub(crate) fn peek(&self, now: Instant) -> Instant {
        if now > self.last { now } else { self.last }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_at_both_ends() {
        assert_eq!(Instant::MAX + Duration::MAX, Instant::MAX);
        assert_eq!(Instant::ZERO - Duration::from_nanos(1), Instant::ZERO);
        assert_eq!(Instant::MAX.checked_add(Duration::from_nanos(1)), None);
        assert_eq!(Instant::ZERO.checked_sub(Duration::from_nanos(1)), None);
        assert_eq!(
            Instant::from_nanos(10).checked_add(Duration::MAX),
            None,
            "a span past u64 nanos does not fit"
        );
        assert_eq!(Instant::from_millis(u64::MAX), Instant::MAX);
        let mut t = Instant::from_nanos(u64::MAX - 1);
        t += Duration::from_secs(1);
        assert_eq!(t, Instant::MAX);
    }

    #[test]
    fn spans_between_instants_are_never_negative() {
        let a = Instant::from_nanos(5);
        let b = Instant::from_nanos(9);
        assert_eq!(b - a, Duration::from_nanos(4));
        assert_eq!(a - b, Duration::ZERO);
        assert_eq!(a.checked_duration_since(b), None);
        assert_eq!(b.checked_duration_since(a), Some(Duration::from_nanos(4)));
    }

    #[test]
    fn ceil_millis_rounds_up_and_saturates() {
        assert_eq!(ceil_millis(Duration::from_nanos(1_000_001)), 2);
        assert_eq!(ceil_millis(Duration::from_nanos(999_999)), 1);
        assert_eq!(ceil_millis(Duration::MAX), u64::MAX);
    }

    #[cfg(feature = "std")]
    #[test]
    fn std_instants_map_to_exact_nanoseconds_since_the_epoch_and_back() {
        let epoch = StdEpoch::new();
        let e = epoch.epoch();
        let span = Duration::new(3, 123_456_789);
        assert_eq!(
            Instant::from_std(epoch, e + span),
            Instant::from_nanos(3_123_456_789)
        );
        assert_eq!(
            Instant::from_nanos(3_123_456_789).to_std(epoch),
            Some(e + span)
        );
        assert_eq!(Instant::from_std(epoch, e), Instant::ZERO);
        assert_eq!(Instant::ZERO.to_std(epoch), Some(e));
    }

    #[cfg(feature = "std")]
    #[test]
    fn a_std_instant_before_the_epoch_saturates_at_zero_and_now_is_monotonic() {
        let early = std::time::Instant::now();
        let epoch = StdEpoch::at(early + Duration::from_secs(60));
        assert_eq!(Instant::from_std(epoch, early), Instant::ZERO);
        let fresh = StdEpoch::new();
        let (a, b) = (fresh.now(), fresh.now());
        assert!(b >= a);
        assert!(
            fresh.now() < Instant::from_millis(60_000),
            "an epoch of now starts near zero"
        );
        assert_eq!(StdEpoch::at(early).epoch(), early);
    }

    #[cfg(feature = "std")]
    #[test]
    fn std_conversions_round_trip_both_ways() {
        let epoch = StdEpoch::new();
        let e = epoch.epoch();
        let spans = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::new(1, 500_000_001),
            Duration::from_secs(86_400),
            Duration::from_secs(100 * 365 * 86_400),
        ];
        for span in spans {
            let at = e + span;
            let core = Instant::from_std(epoch, at);
            assert_eq!(core.as_nanos(), duration_to_nanos(span), "{span:?}");
            assert_eq!(core.to_std(epoch), Some(at), "std → core → std, {span:?}");
        }
        for nanos in [0, 1, 999_999, 1_500_000_000, u64::MAX / 2, u64::MAX - 1] {
            let core = Instant::from_nanos(nanos);
            let at = core.to_std(epoch).expect("representable on this platform");
            assert_eq!(
                Instant::from_std(epoch, at),
                core,
                "core → std → core, {nanos}"
            );
        }
        // Another epoch is another timeline: the same std instant, a different core one.
        let later = StdEpoch::at(e + Duration::from_secs(2));
        assert_eq!(
            Instant::from_std(later, e + Duration::from_secs(5)),
            Instant::from_millis(3_000)
        );
    }

    #[cfg(all(feature = "std", unix))]
    #[test]
    fn a_std_instant_past_the_last_core_instant_saturates_at_max() {
        let epoch = StdEpoch::new();
        let e = epoch.epoch();
        // 600 years: past the 584 of `u64` nanoseconds, within a unix `Instant` (i64 seconds).
        let far = e
            .checked_add(Duration::from_secs(600 * 365 * 86_400))
            .expect("unix instants reach 600 years ahead");
        assert_eq!(Instant::from_std(epoch, far), Instant::MAX);
        assert_eq!(
            Instant::from_std(epoch, e + Duration::from_nanos(u64::MAX)),
            Instant::MAX,
            "exactly the last instant"
        );
        let max = Instant::MAX
            .to_std(epoch)
            .expect("584 years fit a unix instant");
        assert_eq!(max, e + Duration::from_nanos(u64::MAX));
        assert!(max < far, "MAX maps to a real instant, not to never");
    }

    #[test]
    fn clock_clamps_time_that_runs_backwards() {
        let mut c = Clock::default();
        assert_eq!(c.observe(Instant::from_nanos(10)), Instant::from_nanos(10));
        assert_eq!(c.observe(Instant::from_nanos(3)), Instant::from_nanos(10));
        assert_eq!(c.peek(Instant::from_nanos(4)), Instant::from_nanos(10));
        assert_eq!(c.peek(Instant::from_nanos(40)), Instant::from_nanos(40));
        assert_eq!(c.observe(Instant::MAX), Instant::MAX);
    }
}
