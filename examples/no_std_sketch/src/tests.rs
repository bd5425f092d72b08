//! Host tests: the node on fake boards.

use super::*;
use core::time::Duration;
use std::vec::Vec;
use throttle_sansio::write_gate::DISK_WRITE_LOCKED_FLOOR;
use throttle_sansio::{BackoffConfig, Signal, WriteGateConfig};

const SEED: u64 = 7;
const NS_PER_MS: u64 = 1_000_000;

/// The default config, but with the disk backoff jittered to the microsecond (a board with
/// a fine timer): its deadlines fall between ticks, so the node must sleep to the tick after.
fn config() -> PacedWriterConfig {
    let disk = BackoffConfig::fluss_disk_write_locked()
        .to_builder()
        .resolution(Duration::from_micros(1))
        .build();
    let gate = WriteGateConfig::default().with_disk_write_locked(disk.unwrap());
    PacedWriterConfig::default().with_gate(gate)
}

fn uplink(seed: u64) -> Uplink {
    match Uplink::new(config(), seed) {
        Ok(up) => up,
        Err(e) => panic!("the config is valid: {e}"),
    }
}

/// A board whose server locks bucket 1's disk twice, piggybacks half pressure on bucket 2's
/// first write and fails bucket 3's first write for good. It works out, from the config and
/// a generator seeded like the node's, when each answer gates its bucket until; `sleep_until`
/// jumps the tick, as an interrupt-free WFI would.
struct FakeBoard {
    now: u64,
    cfg: PacedWriterConfig,
    /// Draws what the node's generator draws: only a retried disk rejection draws.
    rng: SplitMix64,
    replies: Vec<(Reply, u8)>,
    /// (tick, bucket) of every send.
    sends: Vec<(u64, u8)>,
    /// Per bucket: the nanosecond before which it is gated, whether a send has not yet
    /// followed the gating, and the current batch's rejections so far.
    not_before: [u64; 4],
    gated: [bool; 4],
    rejections: [u32; 4],
    /// (bucket, tick its wait ended, tick its next send left).
    waits: Vec<(u8, u64, u64)>,
}

impl FakeBoard {
    fn new() -> Self {
        FakeBoard {
            now: 0,
            cfg: config(),
            rng: SplitMix64::new(SEED),
            replies: Vec::new(),
            sends: Vec::new(),
            not_before: [0; 4],
            gated: [false; 4],
            rejections: [0; 4],
            waits: Vec::new(),
        }
    }

    fn gate_for(&mut self, bucket: u8, delay: Duration) {
        let i = usize::from(bucket);
        self.not_before[i] = self.now * NS_PER_MS + u64::try_from(delay.as_nanos()).unwrap();
        self.gated[i] = true;
    }
}

impl Board for FakeBoard {
    fn millis(&self) -> u64 {
        self.now
    }
    fn send(&mut self, id: BatchId, bucket: u8, readings: &[Reading]) {
        let i = usize::from(bucket);
        assert!(!readings.is_empty());
        let at = self.now * NS_PER_MS;
        assert!(
            at >= self.not_before[i],
            "bucket {bucket} sent to while gated"
        );
        if core::mem::take(&mut self.gated[i]) {
            let ended = self.not_before[i].div_ceil(NS_PER_MS);
            self.waits.push((bucket, ended, self.now));
        }
        let earlier = self.sends.iter().filter(|s| s.1 == bucket).count();
        self.sends.push((self.now, bucket));
        let outcome = match bucket {
            1 if earlier < 2 => WriteOutcome::DiskWriteLocked,
            2 if earlier == 0 => WriteOutcome::Ok {
                pressure: Signal::Pressure(500_000),
            },
            3 if earlier == 0 => WriteOutcome::Fatal,
            _ => WriteOutcome::Ok {
                pressure: Signal::Clear,
            },
        };
        self.replies.push((Reply { id, outcome }, bucket));
    }
    fn poll_reply(&mut self) -> Option<Reply> {
        if self.replies.is_empty() {
            return None;
        }
        let (reply, bucket) = self.replies.remove(0);
        // The node feeds the answer at the tick it reads it: the gate starts from there.
        let gate = self.cfg.gate().clone();
        match reply.outcome {
            WriteOutcome::DiskWriteLocked => {
                let attempts = self.rejections[usize::from(bucket)];
                let delay = gate.disk_write_locked().delay_for(attempts, &mut self.rng);
                self.gate_for(bucket, delay.max(DISK_WRITE_LOCKED_FLOOR));
                self.rejections[usize::from(bucket)] += 1;
            }
            WriteOutcome::Ok { pressure } => {
                if pressure != Signal::Clear {
                    self.gate_for(bucket, gate.kv_curve().delay(pressure));
                }
                self.rejections[usize::from(bucket)] = 0;
            }
            _ => {}
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
fn the_loop_writes_every_batch_and_retries_within_the_slack_of_each_wait_end() {
    let mut up = uplink(SEED);
    let mut board = FakeBoard::new();
    for bucket in 0..4u8 {
        up.record(0, bucket, 10).unwrap();
        up.record(0, bucket, 11).unwrap(); // joins the first batch
    }
    up.step(&mut board);
    assert_eq!(
        board.sends,
        [(0, 0), (0, 1), (0, 2), (0, 3)],
        "first step sends all"
    );
    for bucket in 0..4u8 {
        up.record(board.now, bucket, 12).unwrap(); // a second batch, behind the one in flight
    }
    for _ in 0..100 {
        if up.pending() == 0 {
            break;
        }
        up.step(&mut board);
    }
    assert_eq!(up.pending(), 0);
    assert_eq!(
        (up.written(), up.lost()),
        (10, 2),
        "bucket 3's first batch failed"
    );
    assert_eq!(
        board.sends.len(),
        8 + 2,
        "each batch once, plus two disk retries"
    );
    // Two disk backoffs on bucket 1, the KV throttle on bucket 2: each next send left at
    // or after the tick the wait the board computed from the config ended, and at most the
    // writer's wake slack (50 ms, 5 % of the 1 s disk backoff) later: never early.
    let slack = config().wake_slack().as_millis() as u64;
    assert_eq!(slack, 50);
    assert_eq!(board.waits.len(), 3, "{:?}", board.waits);
    for (bucket, ended, sent) in &board.waits {
        assert!(
            ended <= sent && *sent <= ended + slack,
            "bucket {bucket}: ended {ended}, sent {sent}"
        );
    }
    assert!(
        board.now >= 1_600,
        "two disk backoffs were waited out on the tick"
    );
}

/// A board whose answers the test delivers by hand.
#[derive(Default)]
struct HandBoard {
    now: u64,
    replies: Vec<Reply>,
    sends: Vec<BatchId>,
    wake: Option<u64>,
}

impl Board for HandBoard {
    fn millis(&self) -> u64 {
        self.now
    }
    fn send(&mut self, id: BatchId, _: u8, _: &[Reading]) {
        self.sends.push(id);
    }
    fn poll_reply(&mut self) -> Option<Reply> {
        self.replies.pop()
    }
    fn sleep_until(&mut self, at_ms: Option<u64>) {
        self.wake = at_ms;
    }
}

#[test]
fn an_answer_for_no_batch_in_flight_is_refused_and_changes_nothing() {
    let ok = WriteOutcome::Ok {
        pressure: Signal::Clear,
    };
    let (mut up, mut board) = (uplink(SEED), HandBoard::default());
    up.record(0, 1, 10).unwrap();
    up.step(&mut board);
    let first = board.sends[0];
    // Another node's batch id.
    let (mut other, mut other_board) = (uplink(SEED), HandBoard::default());
    other.record(0, 1, 10).unwrap();
    other.step(&mut other_board);
    let foreign = other_board.sends[0];

    let refused = up.answer(
        0,
        Reply {
            id: foreign,
            outcome: ok,
        },
    );
    assert_eq!(refused, Err(ResponseError::Unknown));
    let locked = WriteOutcome::DiskWriteLocked;
    assert_eq!(
        up.answer(
            0,
            Reply {
                id: first,
                outcome: locked
            }
        ),
        Ok(())
    );
    let stale = up.answer(
        0,
        Reply {
            id: first,
            outcome: ok,
        },
    );
    assert_eq!(stale, Err(ResponseError::AlreadyAnswered));
    // Through the loop too: ignored, nothing acked, failed or resent early.
    let fatal = WriteOutcome::Fatal;
    board.replies.extend([
        Reply {
            id: foreign,
            outcome: fatal,
        },
        Reply {
            id: first,
            outcome: ok,
        },
    ]);
    up.step(&mut board);
    assert_eq!((up.written(), up.lost(), up.pending()), (0, 0, 1));
    assert_eq!(
        board.sends,
        [first],
        "the rejected batch waits out its backoff"
    );

    // The real retry is answered as usual.
    board.now = board.wake.expect("the node wakes for its backoff");
    up.step(&mut board);
    let retry = board.sends[1];
    assert_ne!(retry, first, "each send has a fresh id");
    assert_eq!(
        up.answer(
            board.now,
            Reply {
                id: retry,
                outcome: ok
            }
        ),
        Ok(())
    );
    up.step(&mut board);
    assert_eq!((up.written(), up.pending()), (1, 0));
}
