//! A `no_std` sketch: a sensor node on a microcontroller uploads readings to a Fluss-like
//! server through the core's [`PacedWriter`], with nothing but a millisecond tick, a link and
//! a sleep. The sketch holds no rule of its own: batching, one batch in flight per bucket,
//! retry counting, the disk backoff and the KV throttle are all the writer's
//! (`docs/paced-writer.md`); the node only moves its inputs and outputs.
//!
//! - **No runtime, no `std`.** Time is the board's tick turned into a core [`Instant`]
//!   ([`Instant::from_millis`]); the loop sleeps (`WFI`) until the writer's
//!   [`poll_timeout`](PacedWriter::poll_timeout) or the next interrupt, the sans-IO contract
//!   every adapter follows.
//! - **`alloc` is required.** The writer's batches and bucket table and its gate's state
//!   allocate through `alloc`; the user's binary provides the `#[global_allocator]` (e.g.
//!   `embedded-alloc` over a static heap) and the `#[panic_handler]`. This library crate
//!   provides neither, so it builds for `thumbv7em-none-eabihf` as is.
//! - **The hasher is the user's too.** `std`'s `RandomState` does not exist here; bucket ids
//!   are the node's own small integers, not attacker-chosen, so a fixed FNV-1a hasher is fine.
//! - **Randomness**: the jitter generator is seeded per node (a unique id, a TRNG word); a
//!   fleet seeded alike would retry in lockstep.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;
#[cfg(test)]
extern crate std;

use core::hash::{BuildHasherDefault, Hasher};

use throttle_sansio::paced_writer::{AppendRefused, BatchId, ResponseError};
use throttle_sansio::rng::SplitMix64;
use throttle_sansio::{ConfigError, Instant, PacedWriter, PacedWriterConfig};
use throttle_sansio::{WriteOutcome, WriterAction};

/// One sensor reading, the record the node uploads.
pub type Reading = u32;

/// The board: a millisecond tick, a link to the server, and a low-power sleep.
pub trait Board {
    /// Milliseconds since boot, monotonic (a SysTick or RTC counter).
    fn millis(&self) -> u64;
    /// Starts sending `readings` of `bucket` as batch `id`; the server's answer comes back
    /// through [`poll_reply`](Self::poll_reply) carrying the same id.
    fn send(&mut self, id: BatchId, bucket: u8, readings: &[Reading]);
    /// The server's answer to an earlier send, if one has arrived.
    fn poll_reply(&mut self) -> Option<Reply>;
    /// Sleeps until the tick reaches `at_ms` (`None`: until an interrupt).
    fn sleep_until(&mut self, at_ms: Option<u64>);
}

/// The server's answer to one batch, as the link's classifier sorted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The batch answered.
    pub id: BatchId,
    /// What the server said.
    pub outcome: WriteOutcome,
}

/// FNV-1a: a fixed hasher for the node's own bucket ids.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// The uploader: the paced writer (buckets `u8`, one server `()` that leads every bucket),
/// the jitter generator, and the tallies of readings written and lost.
#[derive(Debug)]
pub struct Uplink {
    writer: PacedWriter<u8, (), Reading, BuildHasherDefault<Fnv>>,
    rng: SplitMix64,
    written: usize,
    lost: usize,
}

impl Uplink {
    /// An uploader with `cfg` (e.g. `PacedWriterConfig::default().with_batch_bytes(256)` for
    /// a small radio frame), drawing jitter from a generator seeded with `seed` (unique per
    /// node). Refuses an invalid `cfg`.
    pub fn new(cfg: PacedWriterConfig, seed: u64) -> Result<Self, ConfigError> {
        Ok(Uplink {
            writer: PacedWriter::new(cfg)?,
            rng: SplitMix64::new(seed),
            written: 0,
            lost: 0,
        })
    }

    /// A new reading for `bucket`, sent by a later [`step`](Self::step). An `Err` hands the
    /// reading back (the writer refuses appends only once closed, which this node never does).
    pub fn record(
        &mut self,
        now_ms: u64,
        bucket: u8,
        r: Reading,
    ) -> Result<(), AppendRefused<Reading>> {
        let bytes = core::mem::size_of::<Reading>() as u64;
        self.writer
            .append(Instant::from_millis(now_ms), bucket, r, bytes)
    }

    /// Readings the server acknowledged.
    pub fn written(&self) -> usize {
        self.written
    }

    /// Readings dropped because their batch failed for good (a fatal answer, retries spent).
    pub fn lost(&self) -> usize {
        self.lost
    }

    /// Batches not yet written or lost.
    pub fn pending(&self) -> usize {
        self.writer.pending_batches()
    }

    /// Feeds one server answer to the writer. An answer for no batch in flight (a duplicate,
    /// another writer's id) is refused with the writer's [`ResponseError`] and changes nothing.
    pub fn answer(&mut self, now_ms: u64, reply: Reply) -> Result<(), ResponseError> {
        let now = Instant::from_millis(now_ms);
        self.writer
            .handle_response(now, reply.id, reply.outcome, &mut self.rng)
    }

    /// One turn of the main loop: feed the answers that arrived (ignoring refused ones), let
    /// the writer wake its parked buckets and drain, carry out its actions, then sleep until
    /// its next wake-up.
    pub fn step<B: Board>(&mut self, board: &mut B) {
        while let Some(reply) = board.poll_reply() {
            // A refused answer changed nothing; a real node might count it for diagnostics.
            let _ = self.answer(board.millis(), reply);
        }
        let now = Instant::from_millis(board.millis());
        self.writer.handle_timeout(now);
        self.writer.drain(now);
        while let Some(action) = self.writer.poll_action() {
            match action {
                WriterAction::Send { bucket, batch, .. } => {
                    if let Some(b) = self.writer.batch(batch) {
                        board.send(batch, bucket, b.records());
                    }
                }
                // The one server leads every bucket: answer the metadata refresh at once.
                WriterAction::RefreshLeader { bucket } => {
                    self.writer.set_leader(now, bucket, Some(()));
                    self.writer.drain(now);
                }
                WriterAction::Acked { batch } => {
                    self.written += batch.len();
                    self.writer.recycle(batch.into_records());
                }
                WriterAction::Failed { batch, .. } => {
                    self.lost += batch.len();
                    self.writer.recycle(batch.into_records());
                }
                _ => {} // `WriterAction` is non-exhaustive
            }
        }
        // The first tick at or after the wake-up: a deadline between ticks rounds up.
        let wake = self
            .writer
            .poll_timeout()
            .map(|at| at.as_nanos().div_ceil(1_000_000));
        board.sleep_until(wake);
    }
}

#[cfg(test)]
mod tests;
