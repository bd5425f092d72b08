//! Allocation counts on the batcher's and window's hot paths after warm-up (`docs/design.md`
//! §2.6: "after warm-up, a decision on a hot path allocates nothing"), with maintenance
//! (`handle_timeout`) running between rounds as a driver would run it.
//!
//! A counting global allocator forwards to the system allocator and counts allocations and
//! reallocations per thread, so tests running in parallel do not see each other's. Each
//! scenario first checks that its warm-up does allocate (the counter works and the scenario
//! exercises growth), then that identical rounds after it allocate nothing.
#![cfg(not(miri))] // miri has its own allocator and would make the rounds very slow

use core::hash::{BuildHasherDefault, Hasher};
use core::time::Duration;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use throttle_sansio::{
    BatchAction, Batcher, BatcherConfig, CreditId, DispatchWindow, Instant, WindowConfig,
};

struct Counting;

thread_local!(static ALLOCATIONS: Cell<u64> = const { Cell::new(0) });

fn count_one() {
    // `try_with`: the allocator may run while this thread's locals are being torn down.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to the system allocator; we only count.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> u64 {
    let before = allocations();
    f();
    allocations() - before
}

#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

type S = BuildHasherDefault<Fnv>;

/// Drives a batcher through rounds: `ops` operations for each shard, a flush, then a full
/// response to every batch sent (each completion may send a queued or parked batch), then
/// `handle_timeout` after `step` of virtual time.
struct Driver {
    b: Batcher<u32, u32, S>,
    now: Instant,
    step: Duration,
    credits: Vec<CreditId>,
}

impl Driver {
    fn new(cfg: BatcherConfig, step: Duration) -> Self {
        Driver {
            b: Batcher::new(cfg),
            now: Instant::ZERO,
            step,
            credits: Vec::with_capacity(4096),
        }
    }

    fn round(&mut self, shards: u32, ops: u32) {
        for s in 0..shards {
            for h in 0..ops {
                self.b.handle_op(self.now, s, h, 10).expect("open");
            }
        }
        self.b.flush(self.now);
        self.collect();
        while let Some(credit) = self.credits.pop() {
            let n = self.b.batch(credit).map_or(0, |b| b.len());
            self.b
                .handle_response(self.now, credit, 0..n)
                .expect("live credit");
            self.collect();
        }
        assert_eq!(self.b.window().live_credits(), 0);
        assert_eq!(self.b.window().shard_count(), 0);
        self.now += self.step;
        self.b.handle_timeout(self.now);
    }

    fn collect(&mut self) {
        while let Some(a) = self.b.poll_action() {
            if let BatchAction::Send { credit, .. } = a {
                self.credits.push(credit);
            }
        }
    }
}

/// Every 10 ms: maintenance runs once per 100 rounds. Every 1.5 s: it runs between every two
/// rounds, at the idle point, which is the hardest case for keeping capacity.
const CADENCES: [Duration; 2] = [Duration::from_millis(10), Duration::from_millis(1500)];

#[test]
fn counter_sees_a_single_allocation() {
    let n = allocations_during(|| {
        let v: Vec<u64> = Vec::with_capacity(4);
        std::hint::black_box(&v);
    });
    assert_eq!(n, 1);
}

#[test]
fn batcher_rounds_allocate_nothing_after_warm_up_whatever_the_shard_count() {
    // Before the fix, 12 shards cost 4 allocations a round and 32 cost 28 (8 spare buffers).
    for step in CADENCES {
        for shards in [8, 12, 32, 64, 200] {
            let mut d = Driver::new(BatcherConfig::reads(), step);
            let warm_up = allocations_during(|| {
                for _ in 0..5 {
                    d.round(shards, 1);
                }
            });
            assert!(warm_up > 0, "the warm-up allocates (the counter works)");
            let steady = allocations_during(|| {
                for _ in 0..100 {
                    d.round(shards, 1);
                }
            });
            assert_eq!(steady, 0, "{shards} shards every {step:?}");
        }
    }
}

#[test]
fn exhausted_batcher_rounds_that_queue_and_park_allocate_nothing_after_warm_up() {
    // One batch in flight per shard and two operations per batch: seven operations per shard
    // send one batch, queue two and park the last, so window queues and parking are exercised.
    let cfg = BatcherConfig::reads()
        .with_max_requests_per_batch(core::num::NonZeroUsize::MIN.saturating_add(1))
        .with_window(WindowConfig::default().with_max_in_flight(1))
        .expect("valid window");
    steady_rounds(cfg, |d, shards| d.round(shards, 7));
}

/// Five rounds of warm-up (which must allocate), then 100 that must not, over 4 and 64
/// shards at each cadence.
fn steady_rounds(cfg: BatcherConfig, mut round: impl FnMut(&mut Driver, u32)) {
    for step in CADENCES {
        for shards in [4, 64] {
            let mut d = Driver::new(cfg, step);
            let warm_up = allocations_during(|| {
                for _ in 0..5 {
                    round(&mut d, shards);
                }
            });
            assert!(warm_up > 0);
            let steady = allocations_during(|| {
                for _ in 0..100 {
                    round(&mut d, shards);
                }
            });
            assert_eq!(steady, 0, "{shards} shards every {step:?}");
        }
    }
}

/// A round under limits that change at run time, as a per-shard limiter drives them: each
/// shard starts the round at a limit of 1 (one batch sent, two queued, the open one parked),
/// grows to 4 (the three held-back batches leave at once), shrinks to 1 with four in flight
/// (releases retire credits until one is left), and ends back at the configured limit.
fn limited_round(d: &mut Driver, shards: u32) {
    let one = core::num::NonZeroUsize::new(1);
    for s in 0..shards {
        d.b.set_max_in_flight(d.now, &s, one);
        for h in 0..7 {
            d.b.handle_op(d.now, s, h, 10).expect("open");
        }
    }
    d.b.flush(d.now);
    d.collect();
    assert_eq!(
        d.credits.len(),
        shards as usize,
        "one batch each under a limit of 1"
    );
    for s in 0..shards {
        d.b.set_max_in_flight(d.now, &s, core::num::NonZeroUsize::new(4));
    }
    d.collect();
    assert_eq!(
        d.credits.len(),
        4 * shards as usize,
        "the grown limit sends the held batches"
    );
    for s in 0..shards {
        d.b.set_max_in_flight(d.now, &s, one);
        assert_eq!(
            d.b.window().available(&s),
            0,
            "nothing revoked: 4 in flight over 1"
        );
    }
    while let Some(credit) = d.credits.pop() {
        let n = d.b.batch(credit).map_or(0, |b| b.len());
        d.b.handle_response(d.now, credit, 0..n)
            .expect("live credit");
        d.collect();
    }
    for s in 0..shards {
        d.b.set_max_in_flight(d.now, &s, None);
    }
    assert_eq!(d.b.window().live_credits(), 0);
    assert_eq!(d.b.window().shard_count(), 0);
    d.now += d.step;
    d.b.handle_timeout(d.now);
}

#[test]
fn limits_changed_at_run_time_allocate_nothing_after_warm_up() {
    let cfg = BatcherConfig::reads()
        .with_max_requests_per_batch(core::num::NonZeroUsize::MIN.saturating_add(1))
        .with_window(WindowConfig::default().with_max_in_flight(2))
        .expect("valid window");
    steady_rounds(cfg, limited_round);
}

#[test]
fn alternating_large_and_small_rounds_allocate_nothing_after_warm_up() {
    let mut d = Driver::new(BatcherConfig::reads(), Duration::from_millis(10));
    for _ in 0..5 {
        d.round(64, 3);
        d.round(8, 1);
    }
    let steady = allocations_during(|| {
        for _ in 0..200 {
            d.round(64, 3);
            d.round(8, 1);
        }
    });
    assert_eq!(steady, 0);
}

#[test]
fn window_bursts_allocate_nothing_after_warm_up() {
    // Before the fix, removing idle shards shrank the map: 4 allocations per burst of 64.
    for step in CADENCES {
        let mut w: DispatchWindow<u32, u32, S> =
            DispatchWindow::new(WindowConfig::default().with_max_in_flight(1)).expect("valid");
        let mut now = Instant::ZERO;
        let mut live: Vec<CreditId> = Vec::with_capacity(256);
        let mut burst = |w: &mut DispatchWindow<u32, u32, S>| {
            for s in 0..64 {
                let d = w.submit(s, s).expect("open").expect("credit");
                live.push(d.credit);
                assert_eq!(w.submit(s, s + 1000), Ok(None), "queued");
            }
            while let Some(c) = live.pop() {
                if let Some(d) = w.complete(c).expect("live") {
                    live.push(d.credit);
                }
            }
            assert_eq!(w.shard_count(), 0);
            now += step;
            w.handle_timeout(now);
        };
        let warm_up = allocations_during(|| {
            for _ in 0..5 {
                burst(&mut w);
            }
        });
        assert!(warm_up > 0);
        let steady = allocations_during(|| {
            for _ in 0..100 {
                burst(&mut w);
            }
        });
        assert_eq!(steady, 0, "bursts every {step:?}");
    }
}

/// The paced writer's send and response paths: per round every bucket gets three records (two
/// batches), one bucket in eight has its first send rejected (a retriable error: the gate
/// installs a backoff and the writer parks the bucket), and the driver loop drains, sleeps
/// until `poll_timeout` and answers until nothing is pending. Acked batches' buffers are
/// recycled. At most 8 buckets are gated at once: the gate itself keeps the capacity of 16
/// gated buckets through an idle point and gives the rest back at its `handle_timeout`
/// (`docs/design.md` §3.3), so more gated buckets per round would measure the gate's floor,
/// not the writer.
#[test]
fn paced_writer_rounds_allocate_nothing_after_warm_up() {
    use throttle_sansio::Signal;
    use throttle_sansio::paced_writer::{
        PacedWriter, PacedWriterConfig, WriteOutcome, WriterAction,
    };
    use throttle_sansio::rng::SplitMix64;

    type W = PacedWriter<u32, u32, u32, S>;
    const OK: WriteOutcome = WriteOutcome::Ok {
        pressure: Signal::Clear,
    };
    for buckets in [4u32, 64] {
        let mut w: W =
            PacedWriter::new(PacedWriterConfig::default().with_batch_bytes(200)).expect("valid");
        let mut rng = SplitMix64::new(5);
        let mut now = Instant::ZERO;
        let mut sent = Vec::with_capacity(256);
        for b in 0..buckets {
            w.set_leader(now, b, Some(b % 4));
        }
        let mut round = |w: &mut W, now: &mut Instant| {
            for b in 0..buckets {
                for r in 0..3 {
                    w.append(*now, b, r, 100).expect("open");
                }
            }
            let mut first = true;
            while w.pending_batches() > 0 {
                w.drain(*now);
                while let Some(a) = w.poll_action() {
                    match a {
                        WriterAction::Send { bucket, batch, .. } => sent.push((bucket, batch)),
                        WriterAction::Acked { batch } | WriterAction::Failed { batch, .. } => {
                            w.recycle(batch.into_records());
                        }
                        _ => {}
                    }
                }
                for (bucket, id) in sent.drain(..) {
                    let outcome = if first && bucket % 8 == 0 {
                        WriteOutcome::Retriable
                    } else {
                        OK
                    };
                    w.handle_response(*now, id, outcome, &mut rng)
                        .expect("in flight");
                }
                first = false;
                while let Some(a) = w.poll_action() {
                    if let WriterAction::Acked { batch } | WriterAction::Failed { batch, .. } = a {
                        w.recycle(batch.into_records());
                    }
                }
                w.drain(*now);
                while let Some(a) = w.poll_action() {
                    if let WriterAction::Send { bucket, batch, .. } = a {
                        sent.push((bucket, batch));
                    }
                }
                for (_, id) in sent.drain(..) {
                    w.handle_response(*now, id, OK, &mut rng)
                        .expect("in flight");
                }
                while let Some(a) = w.poll_action() {
                    if let WriterAction::Acked { batch } | WriterAction::Failed { batch, .. } = a {
                        w.recycle(batch.into_records());
                    }
                }
                if let Some(at) = w.poll_timeout() {
                    *now = at;
                    w.handle_timeout(*now);
                }
            }
            *now += Duration::from_millis(10);
            w.handle_timeout(*now);
        };
        let warm_up = allocations_during(|| {
            for _ in 0..20 {
                round(&mut w, &mut now);
            }
        });
        assert!(warm_up > 0, "the warm-up allocates (the counter works)");
        let steady = allocations_during(|| {
            for _ in 0..100 {
                round(&mut w, &mut now);
            }
        });
        assert_eq!(steady, 0, "{buckets} buckets");
    }
}

/// The adaptive limiter has no heap at all: construction and every decision, windowed or
/// not, allocate nothing, from the first sample on (there is no warm-up to grow).
#[test]
fn the_adaptive_limiter_allocates_nothing_from_construction_on() {
    use throttle_sansio::limiter::{
        AimdConfig, Gradient2Config, Limiter, LimiterConfig, Sample, SampleWindowConfig,
    };
    let ms = Duration::from_millis(1);
    let window = SampleWindowConfig::default()
        .with_window_time(10 * ms, 100 * ms)
        .with_window_size(4);
    let configs = [
        LimiterConfig::aimd(AimdConfig::default().with_limits(1, 4, 64)),
        LimiterConfig::gradient2(Gradient2Config::default().with_limits(1, 4, 64)),
        LimiterConfig::aimd(AimdConfig::default()).with_window(window),
        LimiterConfig::gradient2(Gradient2Config::default()).with_window(window),
    ];
    // The counter works on this thread (a Vec allocates).
    assert!(allocations_during(|| drop(Vec::<u8>::with_capacity(8))) > 0);
    for config in configs {
        let (mut changes, mut spread) = (0u32, (u32::MAX, 0u32));
        let n = allocations_during(|| {
            let mut limiter = Limiter::new(config).expect("valid");
            for i in 0..20_000u64 {
                let now = Instant::from_nanos(i * 300_000);
                let rtt = Duration::from_micros(500 + (i * 7919) % 3_000);
                let start = now.saturating_sub(rtt);
                let in_flight = (i % 80) as u32;
                let sample = if i % 50 == 0 {
                    Sample::dropped(start, now, in_flight)
                } else {
                    Sample::ok(start, now, in_flight)
                };
                if limiter.on_sample(now, sample).is_some() {
                    changes += 1;
                }
                spread = (spread.0.min(limiter.limit()), spread.1.max(limiter.limit()));
            }
        });
        assert_eq!(n, 0, "{config:?}");
        // The runs did decide: the limit moved, both ways.
        assert!(
            changes > 10 && spread.0 < spread.1,
            "{config:?}: {changes} {spread:?}"
        );
    }
}
