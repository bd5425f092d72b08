//! The paced writer's settings.

use crate::error::ConfigError;
use crate::write_gate::WriteGateConfig;

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

    /// Refuses a zero batch size and an invalid gate configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
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
