//! A `no_std` sketch: a sensor node on a microcontroller uploads records to a Fluss-like
//! server through a [`WriteGate`], with nothing but a millisecond tick, a link and a sleep.
//!
//! - **No runtime, no `std`.** Time is the board's tick turned into a core [`Instant`]
//!   ([`Instant::from_millis`]); the loop sleeps (`WFI`) until the gate's
//!   [`poll_timeout`](WriteGate::poll_timeout) or the next interrupt, the sans-IO contract
//!   every adapter follows.
//! - **`alloc` is required.** The keyed machines (the gate's bucket table, its config's
//!   reason registry) allocate through `alloc`; the user's binary provides the
//!   `#[global_allocator]` (e.g. `embedded-alloc` over a static heap) and the panic handler.
//!   This library crate provides neither, so it builds for `thumbv7em-none-eabihf` as is.
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

use throttle_sansio::rng::SplitMix64;
use throttle_sansio::{ConfigError, GateState, Instant, Signal, WriteGate, WriteGateConfig};

/// Buckets the node writes to (one record queue each).
pub const BUCKETS: usize = 4;

/// The board: a millisecond tick, a link to the server, and a low-power sleep.
pub trait Board {
    /// Milliseconds since boot, monotonic (a SysTick or RTC counter).
    fn millis(&self) -> u64;
    /// Starts sending the oldest record of `bucket`; the reply comes through
    /// [`poll_reply`](Self::poll_reply).
    fn send(&mut self, bucket: u8);
    /// The server's reply to an earlier send, if one has arrived.
    fn poll_reply(&mut self) -> Option<Reply>;
    /// Sleeps until the tick reaches `at_ms` (`None`: until an interrupt).
    fn sleep_until(&mut self, at_ms: Option<u64>);
}

/// A server's reply to one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Written; the leader piggybacked its backpressure.
    Written {
        /// The record's bucket.
        bucket: u8,
        /// The leader's pressure.
        pressure: Signal,
    },
    /// Refused with `DISK_WRITE_LOCKED`: retry the same record after the backoff.
    DiskWriteLocked {
        /// The record's bucket.
        bucket: u8,
    },
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

/// The uploader: the gate, the jitter generator, and per bucket the records left to send,
/// whether one is in flight and how often the head was refused.
#[derive(Debug)]
pub struct Uplink {
    gate: WriteGate<u8, BuildHasherDefault<Fnv>>,
    rng: SplitMix64,
    queued: [u32; BUCKETS],
    in_flight: [bool; BUCKETS],
    attempts: [u32; BUCKETS],
}

impl Uplink {
    /// An uploader with the gate's default (Fluss) configuration, drawing jitter from a
    /// generator seeded with `seed` (unique per node).
    pub fn new(seed: u64) -> Result<Self, ConfigError> {
        Ok(Uplink {
            gate: WriteGate::new(WriteGateConfig::default())?,
            rng: SplitMix64::new(seed),
            queued: [0; BUCKETS],
            in_flight: [false; BUCKETS],
            attempts: [0; BUCKETS],
        })
    }

    /// A new record for `bucket` (ignored for a bucket out of range).
    pub fn enqueue(&mut self, bucket: u8) {
        if let Some(q) = self.queued.get_mut(usize::from(bucket)) {
            *q = q.saturating_add(1);
        }
    }

    /// Records not yet written, over all buckets.
    pub fn backlog(&self) -> u32 {
        self.queued.iter().sum()
    }

    /// One turn of the main loop: apply the replies that arrived, send the head record of
    /// every open bucket with nothing in flight, then sleep until the gate's next opening.
    pub fn step<B: Board>(&mut self, board: &mut B) {
        while let Some(reply) = board.poll_reply() {
            let now = Instant::from_millis(board.millis());
            match reply {
                Reply::Written { bucket, pressure } => {
                    let i = usize::from(bucket) % BUCKETS;
                    self.in_flight[i] = false;
                    self.attempts[i] = 0;
                    self.queued[i] = self.queued[i].saturating_sub(1);
                    self.gate.handle_success(now, &bucket);
                    self.gate.handle_kv_signal(now, &bucket, pressure);
                }
                Reply::DiskWriteLocked { bucket } => {
                    let i = usize::from(bucket) % BUCKETS;
                    self.in_flight[i] = false;
                    let attempts = self.attempts[i];
                    self.gate
                        .handle_disk_write_locked(now, &bucket, attempts, &mut self.rng);
                    self.attempts[i] = attempts.saturating_add(1);
                }
            }
        }
        let now = Instant::from_millis(board.millis());
        self.gate.handle_timeout(now); // evicts what expired; cheap when nothing did
        for (i, bucket) in (0..BUCKETS).zip(0u8..) {
            if self.queued[i] > 0
                && !self.in_flight[i]
                && self.gate.check(now, &bucket) == GateState::Open
            {
                self.gate.handle_send(now, &bucket);
                self.in_flight[i] = true;
                board.send(bucket);
            }
        }
        // A single loop re-reads the gate every turn, so its `Wake`s need no listener.
        while self.gate.poll_action().is_some() {}
        let wake = self
            .gate
            .poll_timeout()
            .map(|at| at.as_nanos().div_ceil(1_000_000));
        board.sleep_until(wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// A board whose server locks bucket 1's disk twice and piggybacks half pressure on
    /// bucket 2's first write; `sleep_until` jumps the tick, as an interrupt-free WFI would.
    #[derive(Default)]
    struct FakeBoard {
        now: u64,
        replies: Vec<Reply>,
        /// (tick, bucket) of every send, and when each bucket may be sent to next.
        sends: Vec<(u64, u8)>,
        not_before: [u64; BUCKETS],
        locks: u32,
    }

    impl Board for FakeBoard {
        fn millis(&self) -> u64 {
            self.now
        }
        fn send(&mut self, bucket: u8) {
            let i = usize::from(bucket);
            assert!(
                self.now >= self.not_before[i],
                "bucket {bucket} sent to while gated"
            );
            self.sends.push((self.now, bucket));
            let reply = if bucket == 1 && self.locks < 2 {
                self.locks += 1;
                self.not_before[i] = self.now + 800; // 1 s - 20 % jitter
                Reply::DiskWriteLocked { bucket }
            } else if bucket == 2 && self.sends.iter().filter(|s| s.1 == 2).count() == 1 {
                self.not_before[i] = self.now + 625; // 5 s ceiling x 0.5^3
                Reply::Written {
                    bucket,
                    pressure: Signal::Pressure(500_000),
                }
            } else {
                Reply::Written {
                    bucket,
                    pressure: Signal::Clear,
                }
            };
            self.replies.push(reply);
        }
        fn poll_reply(&mut self) -> Option<Reply> {
            self.replies.pop()
        }
        fn sleep_until(&mut self, at_ms: Option<u64>) {
            match at_ms {
                Some(at) => self.now = self.now.max(at),
                None => self.now += 1, // the next tick interrupt
            }
        }
    }

    #[test]
    fn the_loop_writes_every_record_and_never_sends_to_a_gated_bucket() {
        let mut up = match Uplink::new(7) {
            Ok(up) => up,
            Err(e) => panic!("the default config is valid: {e}"),
        };
        for bucket in 0..BUCKETS as u8 {
            up.enqueue(bucket);
            up.enqueue(bucket);
        }
        let mut board = FakeBoard::default();
        for _ in 0..100 {
            if up.backlog() == 0 {
                break;
            }
            up.step(&mut board);
        }
        assert_eq!(up.backlog(), 0);
        assert_eq!(
            board.sends.len(),
            2 * BUCKETS + 2,
            "each record once, plus two retries"
        );
        assert!(
            board.now >= 1_600,
            "two disk backoffs were waited out on the tick"
        );
    }
}
