//! Peak tracking and maintenance scheduling shared by the machines that give memory back
//! (the dispatch window, the batcher): when a run may shrink a collection, and how far.

use core::time::Duration;

use crate::time::Instant;

/// How often `handle_timeout` may give memory back (window and batcher alike).
///
/// Each run judges the peak use seen since the previous run, so a workload that repeats more
/// often than this keeps everything it uses, and an idle one gets its memory back within two
/// intervals.
pub const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(1);

/// Collections keep at least this much capacity when they shrink.
pub(crate) const MIN_CAPACITY: usize = 16;

/// The high-water mark of a count since the last maintenance run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Peak(usize);

impl Peak {
    #[inline]
    pub(crate) fn see(&mut self, n: usize) {
        if n > self.0 {
            self.0 = n;
        }
    }

    /// The peak of the period that ends now; the next period starts at `current`.
    pub(crate) fn roll(&mut self, current: usize) -> usize {
        let peak = self.0.max(current);
        self.0 = current;
        peak
    }
}

/// When maintenance may run next, whether a run could still give memory back, and how far.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Maintenance {
    last_run: Instant,
    /// An input arrived since the last run, so the peaks may have moved.
    touched: bool,
    /// The last run judged a busy period; the next one, judging a quieter period, may shrink.
    pending: bool,
    /// Capacity a collection keeps when it shrinks ([`MIN_CAPACITY`]; lower in model checks,
    /// so that short runs reach the shrinking paths).
    floor: usize,
}

impl Default for Maintenance {
    fn default() -> Self {
        Maintenance {
            last_run: Instant::ZERO,
            touched: false,
            pending: false,
            floor: MIN_CAPACITY,
        }
    }
}

impl Maintenance {
    /// The capacity to shrink a collection to, if it should shrink at all: only once the
    /// recent `peak` is below a quarter of `capacity`, and then to twice that peak (at least
    /// the floor). Growing back to the peak therefore allocates nothing, and a workload cannot
    /// make a collection alternate between shrinking and growing.
    pub(crate) fn target(&self, capacity: usize, peak: usize) -> Option<usize> {
        let target = peak.saturating_mul(2).max(self.floor);
        (peak < capacity / 4 && target < capacity).then_some(target)
    }

    #[cfg(feature = "model")]
    pub(crate) fn set_floor(&mut self, floor: usize) {
        self.floor = floor;
    }

    #[inline]
    pub(crate) fn touch(&mut self) {
        self.touched = true;
    }

    /// The next run's deadline, or `None` when nothing could be given back.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        (self.touched || self.pending).then(|| self.last_run + MAINTENANCE_INTERVAL)
    }

    /// Whether a run is due at `now` (already clamped); if so, the next period starts now.
    pub(crate) fn begin(&mut self, now: Instant) -> bool {
        if now < self.last_run + MAINTENANCE_INTERVAL {
            return false;
        }
        self.last_run = now;
        self.pending = core::mem::take(&mut self.touched);
        true
    }
}
