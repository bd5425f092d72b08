//! The batcher's configuration.

use super::*;

/// Which limits a batcher applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BatchKind {
    /// Read batches are bounded by operation count only.
    Read,
    /// Write batches are bounded by operation count and by `max_batch_bytes`.
    Write,
}

/// Configuration of a [`Batcher`]: batch limits and the dispatch window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatcherConfig {
    pub(super) kind: BatchKind,
    pub(super) max_requests_per_batch: NonZeroUsize,
    pub(super) max_batch_bytes: NonZeroU64,
    /// Valid: [`BatcherConfig::with_window`] refuses an invalid one.
    pub(super) window: WindowConfig,
    pub(super) oversized: Oversized,
    /// How long an operation may wait for its end, from its acceptance (`None`: forever).
    pub(super) op_timeout: Option<Duration>,
}

/// 1000 operations per batch (Oxia's `maxRequestsPerBatch`).
const DEFAULT_MAX_REQUESTS: NonZeroUsize = match NonZeroUsize::new(1000) {
    Some(n) => n,
    None => NonZeroUsize::MIN,
};

/// 128 KiB per write batch (Oxia's `maxBatchSize`).
const DEFAULT_MAX_BYTES: NonZeroU64 = match NonZeroU64::new(128 * 1024) {
    Some(n) => n,
    None => NonZeroU64::MIN,
};

impl Default for BatcherConfig {
    /// The Oxia Java client's write defaults: 1000 operations (`maxRequestsPerBatch`), 128 KiB,
    /// 4 batches in flight per shard (`maxWriteBatchesInFlight`, PR #360).
    fn default() -> Self {
        BatcherConfig {
            kind: BatchKind::Write,
            max_requests_per_batch: DEFAULT_MAX_REQUESTS,
            max_batch_bytes: DEFAULT_MAX_BYTES,
            window: WindowConfig::default(),
            oversized: Oversized::TravelAlone,
            op_timeout: None,
        }
    }
}

impl BatcherConfig {
    /// The defaults for writes (same as `Default`).
    pub fn writes() -> Self {
        Self::default()
    }

    /// The defaults for reads: 1000 operations per batch, no byte limit, 4 in flight.
    pub fn reads() -> Self {
        BatcherConfig {
            kind: BatchKind::Read,
            ..Self::default()
        }
    }

    /// At most `n` operations per batch. Infallible: a zero limit cannot be written.
    #[must_use]
    pub fn with_max_requests_per_batch(mut self, n: NonZeroUsize) -> Self {
        self.max_requests_per_batch = n;
        self
    }

    /// Write batches stop before exceeding `bytes` (ignored for reads). Infallible: a zero
    /// limit cannot be written.
    #[must_use]
    pub fn with_max_batch_bytes(mut self, bytes: NonZeroU64) -> Self {
        self.max_batch_bytes = bytes;
        self
    }

    /// The per-shard dispatch window. The one fallible builder: a [`WindowConfig`] can still
    /// be invalid (`max_in_flight` 0), and is refused here with its own error, so a
    /// `BatcherConfig` is valid by construction and [`Batcher::new`] cannot fail.
    ///
    /// ```
    /// use throttle_sansio::{BatcherConfig, WindowConfig};
    ///
    /// let four = BatcherConfig::reads().with_window(WindowConfig::default().with_max_in_flight(4));
    /// assert_eq!(four.map(|c| c.window().max_in_flight()), Ok(4));
    /// assert!(BatcherConfig::reads().with_window(WindowConfig::default().with_max_in_flight(0)).is_err());
    /// ```
    pub fn with_window(mut self, window: WindowConfig) -> Result<Self, ConfigError> {
        window.validate()?;
        self.window = window;
        Ok(self)
    }

    /// At most `n` batches in flight per shard: the window of
    /// [`WindowConfig::new(n)`](WindowConfig::new), infallible since `n` is not 0.
    ///
    /// ```
    /// use core::num::NonZeroUsize;
    /// use throttle_sansio::BatcherConfig;
    ///
    /// let two = NonZeroUsize::new(2).expect("not zero");
    /// assert_eq!(BatcherConfig::writes().with_max_in_flight(two).window().max_in_flight(), 2);
    /// ```
    #[must_use]
    pub fn with_max_in_flight(mut self, n: NonZeroUsize) -> Self {
        self.window = WindowConfig::new(n);
        self
    }

    /// What a write batcher does with an operation larger than
    /// [`max_batch_bytes`](Self::max_batch_bytes): [`Oversized::TravelAlone`] (the default)
    /// or [`Oversized::Reject`]. Ignored for reads (no byte limit).
    ///
    /// ```
    /// use throttle_sansio::{BatcherConfig, Oversized};
    ///
    /// assert_eq!(BatcherConfig::writes().oversized(), Oversized::TravelAlone);
    /// assert_eq!(BatcherConfig::writes().with_oversized(Oversized::Reject).oversized(), Oversized::Reject);
    /// ```
    #[must_use]
    pub fn with_oversized(mut self, oversized: Oversized) -> Self {
        self.oversized = oversized;
        self
    }

    /// What happens to an operation larger than the batch limit.
    pub fn oversized(&self) -> Oversized {
        self.oversized
    }

    /// Gives every operation a deadline: its acceptance by [`Batcher::handle_op`] (the
    /// batcher's clamped clock) plus `timeout`, saturating at [`Instant::MAX`]. There is none
    /// by default; the Oxia Java client's is 30 s (`OxiaClientBuilder.DefaultRequestTimeout`).
    ///
    /// - An operation not yet sent (open, parked, queued or requeued) whose deadline has
    ///   passed is taken out of its batch by [`Batcher::handle_timeout`] (and by
    ///   [`Batcher::flush`], which runs the same step first) and ends with
    ///   [`FailReason::TimedOut`]; a batch left empty is dropped without taking a credit.
    ///   Once [`Batcher::poll_timeout`] has passed, run `handle_timeout` before reporting a
    ///   batch's end, a requeue or a resume: the credit those free would otherwise send an
    ///   overdue operation (with a deadline already past; the `sync` driver does this).
    /// - A batch that leaves carries the earliest deadline of its operations
    ///   ([`Batch::deadline`], the one RPC carries them all, as a gRPC deadline would): the
    ///   caller enforces it on the send, and reports a send that outlives it with
    ///   [`Batcher::handle_failure`] (the driver in `sync` does, as `OpError::TimedOut`).
    ///
    /// A `timeout` of zero times out every operation that has not left by the next
    /// `handle_timeout`.
    ///
    /// ```
    /// use core::time::Duration;
    /// use throttle_sansio::BatcherConfig;
    ///
    /// assert_eq!(BatcherConfig::writes().op_timeout(), None);
    /// let oxia = BatcherConfig::writes().with_op_timeout(Duration::from_secs(30));
    /// assert_eq!(oxia.op_timeout(), Some(Duration::from_secs(30)));
    /// ```
    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = Some(timeout);
        self
    }

    /// The operation timeout ([`with_op_timeout`](Self::with_op_timeout)), if any.
    pub fn op_timeout(&self) -> Option<Duration> {
        self.op_timeout
    }

    /// Read or write limits.
    pub fn kind(&self) -> BatchKind {
        self.kind
    }

    /// Operations per batch at most (at least 1).
    pub fn max_requests_per_batch(&self) -> usize {
        self.max_requests_per_batch.get()
    }

    /// Bytes per write batch at most (at least 1; an operation larger than this goes alone).
    pub fn max_batch_bytes(&self) -> u64 {
        self.max_batch_bytes.get()
    }

    /// The per-shard dispatch window.
    pub fn window(&self) -> WindowConfig {
        self.window
    }
}
