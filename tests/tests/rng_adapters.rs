//! Generators from outside rand_core 0.10 drive the machines: [`FnRng`] (any `FnMut() -> u64`)
//! and [`Rand09`] (any rand_core 0.9 `RngCore`, i.e. rand 0.9's `rand::rng()`).
//!
//! The draws must be the generator's: a fixed word sequence gives the exact jittered delays
//! worked out by hand below, and an adapter over a SplitMix64 stream decides exactly as
//! SplitMix64 itself does.
//!
//! The hand-worked delays: Fluss's ±20 % jitter draws a factor `f = 800 000 + below(400 000)`
//! ppm, and `below(b)` of a word `w` is `⌊w·b / 2⁶⁴⌋` unless the low half of `w·b` is under
//! `2⁶⁴ mod b` (151 616 for `b = 400 000`), when the word is redrawn. So `u64::MAX` gives
//! `f = 1 199 999`, `2⁶³ + 1` gives `1 000 000`, `1` gives `800 000`, and `0` is rejected
//! (then `2⁶² + 1` gives `900 000`). The delay is `⌊base·f/10⁶⌋` cut to whole milliseconds.

use std::hash::RandomState;
use std::time::Duration;

use throttle_sansio::backoff::{Backoff, BackoffConfig, Jitter};
use throttle_sansio::rng::{FnRng, Rand09, Rng, SplitMix64};
use throttle_sansio::{Instant, WriteGate};

type Gate = WriteGate<u32, RandomState>;

/// The scripts, and the factor (ppm) each gives, with how many words it takes.
const SCRIPTS: [(&[u64], u64, usize); 4] = [
    (&[u64::MAX], 1_199_999, 1),
    (&[(1 << 63) + 1], 1_000_000, 1),
    (&[1], 800_000, 1),
    (&[0, (1 << 62) + 1], 900_000, 2),
];

/// `⌊base·f/10⁶⌋` in whole milliseconds, as the backoff truncates it.
fn expected(base_ms: u64, factor_ppm: u64) -> Duration {
    Duration::from_millis(base_ms * factor_ppm / 1_000_000)
}

/// A rand_core 0.9 generator replaying fixed words and counting each method's calls.
#[derive(Default)]
struct Counting09 {
    words: Vec<u64>,
    next: usize,
    u32_calls: usize,
    u64_calls: usize,
    fill_calls: usize,
}

impl Counting09 {
    fn new(words: &[u64]) -> Self {
        Counting09 {
            words: words.to_vec(),
            ..Counting09::default()
        }
    }

    /// The next scripted word; a draw past the script is a test failure, not a loop.
    fn word(&mut self) -> u64 {
        let w = *self
            .words
            .get(self.next)
            .expect("drew more words than the script holds");
        self.next += 1;
        w
    }
}

impl rand_core_0_9::RngCore for Counting09 {
    fn next_u32(&mut self) -> u32 {
        self.u32_calls += 1;
        self.word() as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.u64_calls += 1;
        self.word()
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.fill_calls += 1;
        dst.fill(0xA5);
    }
}

#[test]
fn fn_rng_words_give_the_exact_disk_backoff_a_gate_installs() {
    for (script, factor, words) in SCRIPTS {
        let mut gate = Gate::new(Default::default()).unwrap();
        let mut taken = 0;
        let now = Instant::from_millis(50);
        // The default gate's disk backoff is Fluss's: 1 s at attempt 0, ±20 %.
        let wait = gate.handle_disk_write_locked(
            now,
            &3,
            0,
            &mut FnRng(|| {
                taken += 1;
                script[taken - 1]
            }),
        );
        assert_eq!(wait, expected(1_000, factor), "script {script:?}");
        assert_eq!(gate.remaining(now, &3), wait);
        assert_eq!(taken, words, "script {script:?}: words drawn");
    }
}

#[test]
fn rand09_words_give_the_exact_retry_backoff_a_gate_installs() {
    for (script, factor, words) in SCRIPTS {
        let mut gate = Gate::new(Default::default()).unwrap();
        let mut theirs = Counting09::new(script);
        let now = Instant::from_millis(50);
        // The retriable-write backoff is Fluss Rust's: 100 ms at attempt 0, ±20 %.
        let wait = gate.handle_retriable_write(now, &9, 0, &mut Rand09(&mut theirs));
        assert_eq!(wait, expected(100, factor), "script {script:?}");
        assert_eq!(theirs.u64_calls, words, "script {script:?}: words drawn");
        assert_eq!((theirs.u32_calls, theirs.fill_calls), (0, 0));
    }
}

#[test]
fn rand09_forwards_every_method_to_the_wrapped_generator() {
    let mut rng = Rand09::new(Counting09::new(&[
        0x1122_3344_5566_7788,
        0xAAAA_BBBB_CCCC_DDDD,
    ]));
    assert_eq!(rng.next_u64(), 0x1122_3344_5566_7788);
    assert_eq!(rng.next_u32(), 0xCCCC_DDDD, "the generator's own next_u32");
    let mut bytes = [0u8; 5];
    rng.fill_bytes(&mut bytes);
    assert_eq!(bytes, [0xA5; 5], "the generator's own fill_bytes");
    let inner = rng.into_inner();
    assert_eq!(
        (inner.u64_calls, inner.u32_calls, inner.fill_calls),
        (1, 1, 1)
    );
}

/// Every jitter kind, over a long sequence with resets: the adapters draw what the stream
/// they wrap draws.
#[test]
fn adapters_over_a_splitmix_stream_decide_as_splitmix_does() {
    struct SplitMix09(SplitMix64);
    impl rand_core_0_9::RngCore for SplitMix09 {
        fn next_u32(&mut self) -> u32 {
            self.0.next_u32()
        }
        fn next_u64(&mut self) -> u64 {
            self.0.next_u64()
        }
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            self.0.fill_bytes(dst)
        }
    }

    let jitters = [
        Jitter::None,
        Jitter::Proportional { ppm: 200_000 },
        Jitter::Additive {
            range: Duration::from_millis(500),
        },
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
    ];
    for jitter in jitters {
        let cfg = BackoffConfig::builder()
            .initial(Duration::from_millis(3))
            .max(Duration::from_secs(30))
            .jitter(jitter)
            .build()
            .unwrap();
        for seed in 0..8 {
            let mut direct = SplitMix64::new(seed);
            let mut source = SplitMix64::new(seed);
            let mut via_fn = FnRng(|| source.next_u64());
            let mut via_09 = Rand09(SplitMix09(SplitMix64::new(seed)));
            let (mut a, mut b, mut c) = (Backoff::new(), Backoff::new(), Backoff::new());
            for step in 0..40 {
                if step % 13 == 12 {
                    a.reset();
                    b.reset();
                    c.reset();
                }
                let want = a.next_delay(&cfg, &mut direct);
                assert_eq!(b.next_delay(&cfg, &mut via_fn), want, "{jitter:?} FnRng");
                assert_eq!(c.next_delay(&cfg, &mut via_09), want, "{jitter:?} Rand09");
                let want = cfg.delay_for(step, &mut direct);
                assert_eq!(cfg.delay_for(step, &mut via_fn), want, "{jitter:?}");
                assert_eq!(cfg.delay_for(step, &mut via_09), want, "{jitter:?}");
            }
            assert_eq!(a, b);
            assert_eq!(a, c);
        }
    }
}
