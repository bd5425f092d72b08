//! The paced writer's settings.

use core::time::Duration;

use crate::error::ConfigError;
use crate::write_gate::{WriteGateConfig, check_wake_slack};

/// The cap on the writer's default wake slack: 50 ms.
pub const DEFAULT_WAKE_SLACK_CAP: Duration = Duration::from_millis(50);

/// Configuration of a [`PacedWriter`](super::PacedWriter): batch size, retry limit, the write
/// gate's delay sources, and which gate inputs the writer feeds.
///
/// ```
/// use throttle_sansio::paced_writer::PacedWriterConfig;
/// let cfg = PacedWriterConfig::default().with_batch_bytes(64 * 1024).with_max_retries(5);
/// assert!(cfg.validate().is_ok());
/// assert!(PacedWriterConfig::default().with_batch_bytes(0).validate().is_err());
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PacedWriterConfig {
    batch_bytes: u64,
    max_retries: u32,
    gate: WriteGateConfig,
    disk_backoff: bool,
    kv_pressure: bool,
    /// `None`: derived from the gate's disk backoff ([`PacedWriterConfig::wake_slack`]).
    wake_slack: Option<Duration>,
}

impl Default for PacedWriterConfig {
    /// The Fluss Java writer's defaults: 2 MiB batches (`client.writer.batch-size`),
    /// unlimited retries (`client.writer.retries` = `Integer.MAX_VALUE`), the write gate's
    /// Fluss defaults ([`WriteGateConfig::default`]), both pacing inputs on.
    fn default() -> Self {
        PacedWriterConfig {
            batch_bytes: 2 * 1024 * 1024,
            max_retries: i32::MAX as u32,
            gate: WriteGateConfig::default(),
            disk_backoff: true,
            kv_pressure: true,
            wake_slack: None,
        }
    }
}

impl PacedWriterConfig {
    /// A batch stops taking records before it would exceed `bytes` (at least 1); a record
    /// larger than this travels alone (`client.writer.batch-size`).
    #[must_use]
    pub fn with_batch_bytes(mut self, bytes: u64) -> Self {
        self.batch_bytes = bytes;
        self
    }

    /// A batch rejected after `n` retries fails (`client.writer.retries`): it is sent at most
    /// `n + 1` times. `0` fails a batch at its first rejection.
    #[must_use]
    pub fn with_max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// The write gate's reasons and delay sources (disk backoff, KV curve, retriable-write
    /// backoff, probe mode).
    #[must_use]
    pub fn with_gate(mut self, gate: WriteGateConfig) -> Self {
        self.gate = gate;
        self
    }

    /// Whether a `DISK_WRITE_LOCKED` rejection backs the bucket off (on by default). Off, the
    /// batch is re-queued and sent again at the next drain: the Java client before Fluss PR
    /// #4293, kept for comparisons (the simulator's naive writer).
    #[must_use]
    pub fn with_disk_backoff(mut self, on: bool) -> Self {
        self.disk_backoff = on;
        self
    }

    /// Whether piggybacked KV pressure and storage-backpressure rejections feed the KV curve
    /// (on by default). Off, pressure is ignored and a storage-backpressure rejection is an
    /// ordinary retriable error: the client before Fluss issue #3454, kept for comparisons.
    #[must_use]
    pub fn with_kv_pressure(mut self, on: bool) -> Self {
        self.kv_pressure = on;
        self
    }

    /// The writer's wake coalescing (timer slack, see
    /// [`WriteGateConfig::with_wake_slack`]): its sleep ends `slack` after the earliest
    /// parked bucket opens, and that drain sends every bucket open by then, so buckets whose
    /// gates open within `slack` of each other share one request per node instead of one
    /// request each. No bucket is sent before its gate opens; none waits more than `slack`
    /// past it (the runtime timer's lateness aside). It replaces the slack of the gate
    /// configuration given to [`Self::with_gate`], set or derived (a slack on that gate
    /// configuration is ignored), and is derived from the disk backoff even when
    /// [`Self::with_disk_backoff`] is off. `Duration::ZERO` wakes at every opening
    /// (the writer before coalescing). At most [`MAX_WAKE_SLACK`](crate::write_gate::MAX_WAKE_SLACK).
    ///
    /// Unset, it is 5 % of the gate's disk backoff's initial delay, at most
    /// [`DEFAULT_WAKE_SLACK_CAP`] (50 ms for the Fluss 1 s backoff). Why: a disk-write-locked
    /// server rejects every bucket it leads at once, and their ±20 % jittered backoffs spread
    /// the openings over 40 % of the delay; a 5 % window packs them into about eight
    /// requests per round instead of one per bucket, while adding at most 5 % to the
    /// shortest disk wait. The cap bounds the added latency of the other reasons (a 100 ms
    /// retriable-write backoff or a short KV throttle can wait up to 50 ms more): set
    /// `Duration::ZERO` where that matters more than request count.
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::paced_writer::PacedWriterConfig;
    /// assert_eq!(PacedWriterConfig::default().wake_slack(), Duration::from_millis(50));
    /// let exact = PacedWriterConfig::default().with_wake_slack(Duration::ZERO);
    /// assert_eq!(exact.wake_slack(), Duration::ZERO);
    /// assert!(PacedWriterConfig::default().with_wake_slack(Duration::from_secs(61)).validate().is_err());
    /// ```
    #[must_use]
    pub fn with_wake_slack(mut self, slack: Duration) -> Self {
        self.wake_slack = Some(slack);
        self
    }

    /// The wake slack the writer uses: the one set with [`Self::with_wake_slack`], else 5 %
    /// of the gate's disk backoff's initial delay, at most [`DEFAULT_WAKE_SLACK_CAP`].
    pub fn wake_slack(&self) -> Duration {
        self.wake_slack.unwrap_or_else(|| {
            (self.gate.disk_write_locked().initial() / 20).min(DEFAULT_WAKE_SLACK_CAP)
        })
    }

    /// The wake slack set with [`Self::with_wake_slack`], or `None` when it is derived.
    pub fn explicit_wake_slack(&self) -> Option<Duration> {
        self.wake_slack
    }

    /// Bytes per batch at most (a larger record goes alone).
    pub fn batch_bytes(&self) -> u64 {
        self.batch_bytes
    }

    /// Retries per batch before it fails.
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// The write gate's configuration.
    pub fn gate(&self) -> &WriteGateConfig {
        &self.gate
    }

    /// Whether disk rejections back off.
    pub fn disk_backoff(&self) -> bool {
        self.disk_backoff
    }

    /// Whether KV pressure is fed to the gate.
    pub fn kv_pressure(&self) -> bool {
        self.kv_pressure
    }

    /// Refuses a zero batch size, a wake slack above [`MAX_WAKE_SLACK`](crate::write_gate::MAX_WAKE_SLACK) and an invalid gate
    /// configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_wake_slack(&crate::options::paced_writer::WAKE_SLACK, self.wake_slack())?;
        if self.batch_bytes == 0 {
            return Err(ConfigError::OutOfRange {
                option: &crate::options::paced_writer::BATCH_BYTES,
                got: 0,
                min: 1,
                max: u64::MAX,
                unit: "bytes",
            });
        }
        self.gate.validate()
    }
}
