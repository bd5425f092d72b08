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

    /// The index of `bucket` if a reply for it answers a record in flight: `None` for a
    /// bucket out of range, or one with nothing sent (a duplicate or corrupt reply).
    fn awaited(&self, bucket: u8) -> Option<usize> {
        let i = usize::from(bucket);
        self.in_flight.get(i).copied()?.then_some(i)
    }

    /// One turn of the main loop: apply the replies that arrived, send the head record of
    /// every open bucket with nothing in flight, then sleep until the gate's next opening.
    /// A reply that answers no record in flight (a bucket out of range, or one with nothing
    /// sent) is ignored: it changes no queue, no flag and no gate.
    pub fn step<B: Board>(&mut self, board: &mut B) {
        while let Some(reply) = board.poll_reply() {
            let now = Instant::from_millis(board.millis());
            match reply {
                Reply::Written { bucket, pressure } => {
                    let Some(i) = self.awaited(bucket) else {
                        continue;
                    };
                    self.in_flight[i] = false;
                    self.attempts[i] = 0;
                    self.queued[i] = self.queued[i].saturating_sub(1);
                    self.gate.handle_success(now, &bucket);
                    self.gate.handle_kv_signal(now, &bucket, pressure);
                }
                Reply::DiskWriteLocked { bucket } => {
                    let Some(i) = self.awaited(bucket) else {
                        continue;
                    };
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
    struct FakeBoard {
        now: u64,
        replies: Vec<Reply>,
        /// (tick, bucket) of every send, and when each bucket may be sent to next.
        sends: Vec<(u64, u8)>,
        not_before: [u64; BUCKETS],
        locks: u32,
        /// The KV throttle the half pressure installs, from the config the uploader uses.
        half_pressure: u64,
    }

    impl Default for FakeBoard {
        fn default() -> Self {
            let delay = WriteGateConfig::default()
                .kv_curve()
                .delay(Signal::Pressure(500_000));
            FakeBoard {
                now: 0,
                replies: Vec::new(),
                sends: Vec::new(),
                not_before: [0; BUCKETS],
                locks: 0,
                half_pressure: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            }
        }
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
                // Gated from when the node reads this reply (`poll_reply`).
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
            let reply = self.replies.pop()?;
            if let Reply::Written {
                bucket,
                pressure: Signal::Pressure(_),
            } = reply
            {
                // The node installs the KV throttle at the tick it reads the reply.
                self.not_before[usize::from(bucket)] = self.now + self.half_pressure;
            }
            Some(reply)
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
        // Bucket 2's second record left exactly when the KV throttle the board computed from
        // the config ended: the loop slept until the gate's opening, not past it.
        let to_2: Vec<u64> = board
            .sends
            .iter()
            .filter(|s| s.1 == 2)
            .map(|s| s.0)
            .collect();
        assert_eq!(to_2.len(), 2);
        assert_eq!(to_2[1], board.not_before[2]);
    }

    /// A board whose replies the test delivers by hand.
    #[derive(Default)]
    struct HandBoard {
        now: u64,
        replies: Vec<Reply>,
        sends: Vec<u8>,
    }

    impl Board for HandBoard {
        fn millis(&self) -> u64 {
            self.now
        }
        fn send(&mut self, bucket: u8) {
            self.sends.push(bucket);
        }
        fn poll_reply(&mut self) -> Option<Reply> {
            self.replies.pop()
        }
        fn sleep_until(&mut self, _: Option<u64>) {}
    }

    #[test]
    fn a_reply_that_answers_no_record_in_flight_changes_nothing() {
        let mut up = match Uplink::new(7) {
            Ok(up) => up,
            Err(e) => panic!("the default config is valid: {e}"),
        };
        up.enqueue(1);
        up.enqueue(1);
        let mut board = HandBoard::default();
        up.step(&mut board);
        assert_eq!(board.sends, [1], "bucket 1's head record is in flight");
        // Out of range (5 and 9 are 1 modulo BUCKETS), and bucket 3 with nothing sent.
        board.replies.extend([
            Reply::Written {
                bucket: 5,
                pressure: Signal::Full,
            },
            Reply::DiskWriteLocked { bucket: 9 },
            Reply::DiskWriteLocked { bucket: 3 },
            Reply::Written {
                bucket: 3,
                pressure: Signal::Full,
            },
        ]);
        up.step(&mut board);
        assert_eq!(
            board.sends,
            [1],
            "bucket 1 is still in flight: nothing resent"
        );
        assert_eq!(up.backlog(), 2, "no record counted as written");
        assert_eq!(up.attempts, [0; BUCKETS], "no rejection counted");
        let now = Instant::from_millis(board.now);
        for bucket in [1, 3, 5, 9] {
            assert_eq!(
                up.gate.check(now, &bucket),
                GateState::Open,
                "bucket {bucket}"
            );
        }
        // The real reply is applied as before.
        board.replies.push(Reply::Written {
            bucket: 1,
            pressure: Signal::Clear,
        });
        up.step(&mut board);
        assert_eq!(up.backlog(), 1);
        assert_eq!(board.sends, [1, 1], "the next record left");
    }
}
