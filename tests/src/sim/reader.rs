//! The reference reader (`docs/design.md` §6): the core [`Batcher`] with its per-shard dispatch
//! window.
//!
//! Reads for a shard join the shard's open batch; the driver calls
//! [`flush`](RefReader::flush) whenever its input queue is empty (no linger timer). With
//! credit the batch goes out at once; without (all `max_in_flight` batches outstanding) it is
//! parked and keeps growing up to `max_requests_per_batch`, full batches queue FIFO, and every
//! completion releases exactly one credit and may dispatch the next batch.
//!
//! `max_in_flight = None` gives the client upstream had before Oxia PR #362: the same
//! batcher with no in-flight limit, so a batch leaves the moment the input queue drains.

use core::num::NonZeroUsize;
use throttle_sansio::batcher::{BatchAction, Batcher, BatcherConfig};
use throttle_sansio::dispatch_window::{CreditId, WindowConfig};
use throttle_sansio::{ConfigError, Instant};

use super::DetHasher;

/// A shard id.
pub type ShardId = u32;
/// The caller's handle for one read.
pub type ReadId = u64;

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReaderAction {
    /// Put the batch under `credit` (`reads` operations) on the wire to `shard`.
    Send {
        /// The destination shard.
        shard: ShardId,
        /// The batch's credit; answer it with [`RefReader::handle_response`].
        credit: CreditId,
        /// Operations in the batch.
        reads: usize,
    },
    /// Read `id` got its value.
    Deliver(ReadId),
    /// Read `id` failed (its batch failed or did not answer it).
    Fail(ReadId),
}

/// The reference reader. Driving contract: inputs [`submit`](Self::submit),
/// [`flush`](Self::flush) (when the input queue is empty) and
/// [`handle_response`](Self::handle_response) / [`handle_failure`](Self::handle_failure) once
/// per sent batch; after each, drain [`poll_action`](Self::poll_action) until `None`.
#[derive(Debug)]
pub struct RefReader {
    batcher: Batcher<ShardId, ReadId, DetHasher>,
}

impl RefReader {
    /// A reader with at most `max_in_flight` batches per shard (`None`: unbounded) and at most
    /// `max_per_batch` reads per batch (0 counts as 1). Refuses `Some(0)` in flight.
    pub fn new(max_in_flight: Option<u32>, max_per_batch: u32) -> Result<Self, ConfigError> {
        let window = WindowConfig::default()
            .with_max_in_flight(max_in_flight.map_or(usize::MAX, |n| n as usize));
        let per_batch = usize::try_from(max_per_batch).unwrap_or(usize::MAX);
        let cfg = BatcherConfig::reads()
            .with_max_requests_per_batch(NonZeroUsize::new(per_batch).unwrap_or(NonZeroUsize::MIN))
            .with_window(window)?;
        Ok(RefReader {
            batcher: Batcher::new(cfg),
        })
    }

    /// Input: a read for `shard`. Refused reads (closed reader) fail at once.
    pub fn submit(&mut self, now: Instant, shard: ShardId, id: ReadId) -> Result<(), ReadId> {
        self.batcher
            .handle_op(now, shard, id, 0)
            .map(drop)
            .map_err(|c| c.into_handle())
    }

    /// Input: the driver's input queue is empty.
    pub fn flush(&mut self, now: Instant) {
        self.batcher.flush(now);
    }

    /// Input: the batch under `credit` was answered in full.
    pub fn handle_response(&mut self, now: Instant, credit: CreditId) -> bool {
        let n = self.batcher.batch(credit).map_or(0, |b| b.len());
        self.batcher.handle_response(now, credit, 0..n).is_ok()
    }

    /// Input: the batch under `credit` failed as a whole.
    pub fn handle_failure(&mut self, now: Instant, credit: CreditId) -> bool {
        self.batcher.handle_failure(now, credit, ()).is_ok()
    }

    /// Output: the next action.
    pub fn poll_action(&mut self) -> Option<ReaderAction> {
        Some(match self.batcher.poll_action()? {
            BatchAction::Send { shard, credit, .. } => ReaderAction::Send {
                reads: self.batcher.batch(credit).map_or(0, |b| b.len()),
                shard,
                credit,
            },
            BatchAction::Deliver { handle, .. } => ReaderAction::Deliver(handle),
            BatchAction::Fail { handle, .. } => ReaderAction::Fail(handle),
            // Future actions: nothing to do for this reader.
            _ => return self.poll_action(),
        })
    }

    /// Batches in flight to `shard`.
    pub fn in_flight(&self, shard: ShardId) -> u32 {
        self.batcher.window().in_flight(&shard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sends(r: &mut RefReader) -> Vec<(CreditId, usize)> {
        let mut out = Vec::new();
        while let Some(a) = r.poll_action() {
            if let ReaderAction::Send { credit, reads, .. } = a {
                out.push((credit, reads));
            }
        }
        out
    }

    #[test]
    fn exhausted_window_parks_the_open_batch_until_a_completion() {
        let mut r = RefReader::new(Some(1), 1000).unwrap();
        let t = Instant::ZERO;
        r.submit(t, 0, 1).unwrap();
        r.flush(t);
        let first = sends(&mut r);
        assert_eq!(first.len(), 1);
        for id in 2..=50 {
            r.submit(t, 0, id).unwrap();
        }
        r.flush(t);
        assert!(sends(&mut r).is_empty(), "no credit: parked");
        assert!(r.handle_response(t, first[0].0));
        let next = sends(&mut r);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].1, 49, "the parked batch grew while waiting");
    }

    #[test]
    fn unbounded_reader_sends_every_flush() {
        let mut r = RefReader::new(None, 1000).unwrap();
        let t = Instant::ZERO;
        for round in 0..10 {
            r.submit(t, 0, round).unwrap();
            r.flush(t);
            assert_eq!(sends(&mut r).len(), 1);
        }
        assert_eq!(r.in_flight(0), 10);
    }
}
