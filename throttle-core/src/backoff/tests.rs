use core::time::Duration;

use super::arith::grow;
use super::builder::{FLUSS_MAX_NS, NS_PER_MS};
use super::config::TWENTY_PERCENT;
use super::jitter::PPM;
use super::*;
use crate::error::ConfigError;
use crate::options::backoff as opt;
use crate::rng::{SplitMix64, below};
use crate::time::duration_to_nanos;
use alloc::vec::Vec;

fn ms_of(d: Duration) -> u128 {
    d.as_millis()
}

fn unjittered(cfg: BackoffConfig) -> BackoffConfig {
    cfg.to_builder().jitter(Jitter::None).build().unwrap()
}

/// The first `n` delays of a fresh sequence, in whole ms (asserting they are whole ms).
fn sequence_ms(cfg: &BackoffConfig, n: usize, seed: u64) -> Vec<u128> {
    let mut rng = SplitMix64::new(seed);
    let mut b = Backoff::new();
    (0..n)
        .map(|_| {
            let d = b.next_delay(cfg, &mut rng).unwrap();
            assert_eq!(d.as_nanos() % 1_000_000, 0, "{d:?} is not whole ms");
            ms_of(d)
        })
        .collect()
}

fn builder_ns(initial: u64, max: u64) -> BackoffConfigBuilder {
    BackoffConfig::builder()
        .initial(Duration::from_nanos(initial))
        .max(Duration::from_nanos(max))
        .resolution(Duration::from_nanos(1))
        .jitter(Jitter::None)
}

#[test]
fn presets_pass_their_own_validation() {
    for cfg in [
        BackoffConfig::fluss_disk_write_locked(),
        BackoffConfig::fluss_retriable_write(),
        BackoffConfig::kafka_retry(),
        BackoffConfig::grpc_connection(),
        BackoffConfig::gobblin_throttling_client(),
        BackoffConfig::default(),
    ] {
        assert_eq!(cfg.to_builder().build(), Ok(cfg.clone()));
    }
    assert_eq!(
        BackoffConfig::default(),
        BackoffConfig::fluss_disk_write_locked()
    );
}

#[test]
fn disk_preset_doubles_from_1s_and_caps_at_10s() {
    // Fluss DISK_WRITE_LOCKED: 1 s doubling to the 10 s maximum.
    let cfg = unjittered(BackoffConfig::fluss_disk_write_locked());
    assert_eq!(
        sequence_ms(&cfg, 7, 1),
        [1000, 2000, 4000, 8000, 10000, 10000, 10000]
    );
    assert_eq!(cfg.cap_attempt(), 4);
    assert_eq!(cfg.floor(), Duration::from_millis(1));
}

#[test]
fn one_to_five_seconds_caps_exactly_at_5000_ms() {
    // Upstream ends this ramp at 4999 ms; we cap exactly.
    let cfg = BackoffConfig::builder()
        .initial(Duration::from_secs(1))
        .max(Duration::from_secs(5))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    assert_eq!(sequence_ms(&cfg, 5, 1), [1000, 2000, 4000, 5000, 5000]);
    assert_eq!(cfg.base_delay(3), Duration::from_secs(5));
}

#[test]
fn retriable_write_and_kafka_presets_double_from_100ms_to_1s() {
    // Fluss retriable write and Kafka retry.backoff.ms = 100, retry.backoff.max.ms = 1000.
    for cfg in [
        BackoffConfig::fluss_retriable_write(),
        BackoffConfig::kafka_retry(),
    ] {
        assert_eq!(
            sequence_ms(&unjittered(cfg), 6, 1),
            [100, 200, 400, 800, 1000, 1000]
        );
    }
}

#[test]
fn grpc_preset_grows_by_1_6_to_120s_in_whole_ms() {
    // gRPC connection backoff: 1 s, ×1.6, capped at 120 s; 6553.6 ms truncates to 6553.
    let cfg = unjittered(BackoffConfig::grpc_connection());
    assert_eq!(
        sequence_ms(&cfg, 13, 1),
        [
            1000, 1600, 2560, 4096, 6553, 10485, 16777, 26843, 42949, 68719, 109951, 120000, 120000
        ]
    );
    // The base itself is exact to the nanosecond (truncation is the last step).
    assert_eq!(cfg.base_delay(4), Duration::from_nanos(6_553_600_000));
    assert_eq!(cfg.base_delay(10), Duration::from_nanos(109_951_162_777));
    assert_eq!(cfg.cap_attempt(), 11);
}

#[test]
fn gobblin_preset_unjittered_is_500ms_doubling_to_10s() {
    // Gobblin's 500 ms start, ×2, 10 s max, without its α·d + 1 growth.
    let cfg = unjittered(BackoffConfig::gobblin_throttling_client());
    assert_eq!(
        sequence_ms(&cfg, 7, 1),
        [500, 1000, 2000, 4000, 8000, 10000, 10000]
    );
}

#[test]
fn proportional_jitter_stays_within_twenty_percent_and_max() {
    let cfg = BackoffConfig::fluss_disk_write_locked();
    let mut rng = SplitMix64::new(7);
    let (mut lo, mut hi) = (u128::MAX, 0);
    for _ in 0..2000 {
        let d = ms_of(cfg.delay_for(0, &mut rng));
        assert!((800..1200).contains(&d), "{d} ms outside [800, 1200)");
        lo = lo.min(d);
        hi = hi.max(d);
    }
    assert!(
        lo < 810 && hi > 1190,
        "the draws span the range: {lo}..{hi}"
    );
    // At the cap, max includes jitter: draws above 10 s clamp to it.
    let mut at_max = 0;
    for _ in 0..2000 {
        let d = ms_of(cfg.delay_for(10, &mut rng));
        assert!((8000..=10000).contains(&d), "{d} ms");
        at_max += usize::from(d == 10000);
    }
    assert!(at_max > 800, "about half the draws clamp to max: {at_max}");
}

#[test]
fn proportional_jitter_is_not_applied_when_initial_equals_max() {
    let cfg = BackoffConfig::kafka_retry()
        .to_builder()
        .max(Duration::from_millis(100))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(3);
    let before = rng.clone();
    for a in [0, 1, 7, u32::MAX] {
        assert_eq!(cfg.delay_for(a, &mut rng), Duration::from_millis(100));
    }
    assert_eq!(rng, before, "a fixed backoff draws nothing");
}

#[test]
fn full_jitter_spans_one_step_to_base() {
    // U[0, 20 ns] on a 1 ns grid: a draw of 0 becomes one step, so 1 ns is drawn twice
    // as often as any other value and 0 never.
    let cfg = builder_ns(10, 1_000).jitter(Jitter::Full).build().unwrap();
    let mut rng = SplitMix64::new(11);
    let mut seen = [0u32; 21];
    for _ in 0..2100 {
        let d = cfg.delay_for(1, &mut rng).as_nanos();
        assert!((1..=20).contains(&d), "{d} ns outside 1..=20 ns");
        if let Some(n) = usize::try_from(d).ok().and_then(|d| seen.get_mut(d)) {
            *n += 1;
        }
    }
    assert!(seen[20] > 50, "the top is reachable: {}", seen[20]);
    assert!(seen[1] > 150, "0 and 1 both give 1 ns: {}", seen[1]);
}

#[test]
fn equal_jitter_is_half_base_plus_up_to_half_base() {
    // base/2 + U[0, base/2]: an odd base of 21 ns gives 10..=20 ns, an even 20 ns 10..=20.
    for (initial, range) in [(21, (10, 20)), (20, (10, 20))] {
        let cfg = builder_ns(initial, 1_000)
            .jitter(Jitter::Equal)
            .build()
            .unwrap();
        let mut rng = SplitMix64::new(12);
        let (mut lo, mut hi) = (u128::MAX, 0);
        for _ in 0..500 {
            let d = cfg.delay_for(0, &mut rng).as_nanos();
            lo = lo.min(d);
            hi = hi.max(d);
        }
        assert_eq!((lo, hi), range, "base {initial} ns");
    }
}

#[test]
fn decorrelated_jitter_draws_between_initial_and_three_times_previous() {
    let cfg = BackoffConfig::builder()
        .initial(Duration::from_millis(100))
        .max(Duration::from_secs(20))
        .jitter(Jitter::Decorrelated)
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(5);
    // Under miri 20 sequences (the bound is checked on every draw): each draw is slow there.
    for _ in 0..if cfg!(miri) { 20 } else { 200 } {
        let mut b = Backoff::new();
        let mut prev = 100;
        for _ in 0..30 {
            let d = ms_of(b.next_delay(&cfg, &mut rng).unwrap());
            assert!(d >= 100 && d <= (3 * prev).min(20_000), "{d} after {prev}");
            prev = d;
        }
    }
    // Outside a sequence, the base of the previous attempt stands in for `prev`.
    let d = ms_of(cfg.delay_for(3, &mut rng));
    assert!((100..=1200).contains(&d), "{d}");
}

/// `(share of draws above `split`, smallest, largest)` over `draws`.
fn spread(draws: &[u128], split: u128) -> (usize, u128, u128) {
    let above = draws.iter().filter(|&&d| d > split).count();
    let lo = draws.iter().copied().min().unwrap_or(0);
    let hi = draws.iter().copied().max().unwrap_or(0);
    (above, lo, hi)
}

#[test]
#[cfg_attr(miri, ignore)] // a distribution's shape, over 1,000s of draws: natively only
fn decorrelated_first_delays_spread_evenly_up_to_three_times_initial() {
    // U[initial, 3·initial] from 1 s: about half the draws lie above 2 s, the extremes
    // approach 1 s and 3 s. A draw pinned to `initial` or capped at 2·prev fails this.
    let cfg = BackoffConfig::builder()
        .initial(Duration::from_secs(1))
        .max(Duration::from_secs(100))
        .jitter(Jitter::Decorrelated)
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(3);
    let firsts: Vec<u128> = (0..1000)
        .map(|_| ms_of(Backoff::new().next_delay(&cfg, &mut rng).unwrap()))
        .collect();
    let (above_2s, lo, hi) = spread(&firsts, 2_000);
    assert!((400..600).contains(&above_2s), "{above_2s}/1000 above 2 s");
    assert!(
        lo < 1_010 && hi > 2_990 && hi <= 3_000,
        "range {lo}..={hi} ms"
    );
    // The stateless query draws from the same range for attempt 0.
    let queried: Vec<u128> = (0..1000)
        .map(|_| ms_of(cfg.delay_for(0, &mut rng)))
        .collect();
    let (above_2s, _, hi) = spread(&queried, 2_000);
    assert!(above_2s > 400 && hi > 2_990, "{above_2s}/1000, top {hi} ms");
}

#[test]
fn decorrelated_later_delays_reach_three_times_the_previous_one() {
    // Far below the cap, each delay is U[initial, 3·prev]: about a third land above 2·prev.
    let cfg = BackoffConfig::builder()
        .initial(Duration::from_millis(100))
        .max(Duration::from_secs(1_000_000))
        .jitter(Jitter::Decorrelated)
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(17);
    let (mut steps, mut above_2x, mut best) = (0u32, 0u32, 0u128);
    for _ in 0..100 {
        let mut b = Backoff::new();
        let mut prev = ms_of(b.next_delay(&cfg, &mut rng).unwrap());
        for _ in 0..10 {
            let d = ms_of(b.next_delay(&cfg, &mut rng).unwrap());
            steps += 1;
            above_2x += u32::from(d > 2 * prev);
            best = best.max(d * 1000 / prev);
            prev = d;
        }
    }
    assert!(
        above_2x * 4 > steps,
        "{above_2x}/{steps} delays above 2·prev"
    );
    assert!(best > 2_950, "largest ratio {best}‰ of the previous delay");
}

#[test]
#[cfg_attr(miri, ignore)] // a distribution's shape, over 1,000s of draws: natively only
fn proportional_jitter_lands_on_both_sides_of_the_base_evenly() {
    // ±20 % around 1 s: a factor drawn only below (or only above) 1 fails this.
    let cfg = BackoffConfig::kafka_retry()
        .to_builder()
        .initial(Duration::from_secs(1))
        .max(Duration::from_secs(100))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(23);
    for attempt in [0, 1, 3] {
        let base = ms_of(cfg.base_delay(attempt));
        let draws: Vec<u128> = (0..1000)
            .map(|_| ms_of(cfg.delay_for(attempt, &mut rng)))
            .collect();
        let (above, lo, hi) = spread(&draws, base);
        let below = draws.iter().filter(|&&d| d < base).count();
        assert!(
            (400..600).contains(&above) && (400..600).contains(&below),
            "attempt {attempt}: {below} below, {above} above {base} ms"
        );
        assert!(lo * 10 < base * 8 + base / 10 && hi * 10 > base * 12 - base / 10);
    }
}

#[test]
fn full_jitter_is_spread_evenly_over_zero_to_base() {
    let cfg = builder_ns(1_000, 1_000_000)
        .jitter(Jitter::Full)
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(29);
    let draws: Vec<u128> = (0..1000)
        .map(|_| cfg.delay_for(0, &mut rng).as_nanos())
        .collect();
    let (upper, lo, hi) = spread(&draws, 500);
    assert!((400..600).contains(&upper), "{upper}/1000 above base/2");
    assert!(lo < 10 && hi > 990 && hi <= 1_000, "range {lo}..={hi} ns");
}

#[test]
fn equal_jitter_is_spread_evenly_over_half_base_to_base() {
    let cfg = builder_ns(1_000, 1_000_000)
        .jitter(Jitter::Equal)
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(31);
    let draws: Vec<u128> = (0..1000)
        .map(|_| cfg.delay_for(0, &mut rng).as_nanos())
        .collect();
    let (upper, lo, hi) = spread(&draws, 750);
    assert!((400..600).contains(&upper), "{upper}/1000 above 3/4 base");
    assert!(
        (500..510).contains(&lo) && (991..=1_000).contains(&hi),
        "{lo}..={hi} ns"
    );
}

#[test]
fn additive_offset_is_drawn_once_per_sequence_and_redrawn_after_reset() {
    let cfg = BackoffConfig::gobblin_throttling_client();
    let mut rng = SplitMix64::new(9);
    let mut b = Backoff::new();
    assert_eq!(b.offset(), None);
    let first = b.next_delay(&cfg, &mut rng).unwrap();
    let off = b.offset().unwrap();
    assert!(off < Duration::from_millis(500));
    assert_eq!(
        first.as_millis(),
        (Duration::from_millis(500) + off).as_millis()
    );
    let start = 500_000_000 + duration_to_nanos(off);
    for a in 1..8u32 {
        let d = b.next_delay(&cfg, &mut rng).unwrap();
        assert_eq!(
            b.offset(),
            Some(off),
            "the offset is kept within a sequence"
        );
        // Growth from the jittered start, capped at max: never below the unjittered base.
        let expect = (u128::from(start) << a).min(10_000_000_000) / 1_000_000;
        assert_eq!(d.as_millis(), expect);
        assert!(d >= cfg.base_delay(a));
    }
    b.reset();
    assert_eq!(b.offset(), None);
    b.next_delay(&cfg, &mut rng).unwrap();
    let redrawn = b.offset().unwrap();
    assert_ne!(redrawn, off, "a new sequence draws a new offset");
}

/// A fresh sequence on `cfg` whose first delay drew additive offset `off` (the first
/// seed below 1000 that does), and the RNG after that draw.
fn sequence_with_offset(cfg: &BackoffConfig, off: u64) -> (Backoff, u64, SplitMix64) {
    for seed in 0..1000 {
        let mut rng = SplitMix64::new(seed);
        let mut b = Backoff::new();
        let first = duration_to_nanos(b.next_delay(cfg, &mut rng).unwrap());
        if b.offset() == Some(Duration::from_nanos(off)) {
            return (b, first, rng);
        }
    }
    panic!("no seed below 1000 draws offset {off}");
}

#[test]
fn additive_sequence_grows_from_the_jittered_start() {
    // `docs/design.md` §3.1: d₀ = initial + off, dₐ₊₁ = min(max, ⌊dₐ·num/den⌋). From 3 ns + 1 ns at
    // ×3/2: 4, 6, 9, 13 ns (scaling the unjittered 3, 4, 6, 9 by 4/3 gave 4, 5, 8, 12).
    let cfg = builder_ns(3, 1_000)
        .multiplier(3, 2)
        .jitter(Jitter::Additive {
            range: Duration::from_nanos(2),
        })
        .build()
        .unwrap();
    let (mut b, first, mut rng) = sequence_with_offset(&cfg, 1);
    let predicted: Vec<u64> = (1..4)
        .map(|a| duration_to_nanos(b.delay_for(&cfg, a, &mut rng)))
        .collect();
    let rest: Vec<u64> = (0..3)
        .map(|_| duration_to_nanos(b.next_delay(&cfg, &mut rng).unwrap()))
        .collect();
    assert_eq!((first, rest), (4, alloc::vec![6, 9, 13]));
    assert_eq!(predicted, [6, 9, 13], "the query grows from the same start");
    // It climbs to the cap and stays there: 13, 19, 28, … 1000.
    let at_cap = b.delay_for(&cfg, u32::MAX, &mut rng);
    assert_eq!(at_cap, Duration::from_nanos(1_000));
    // Offset 0 is the unjittered ramp.
    let (mut b, first, mut rng) = sequence_with_offset(&cfg, 0);
    assert_eq!(first, 3);
    for a in 1..20 {
        let d = b.next_delay(&cfg, &mut rng).unwrap();
        assert_eq!(d, cfg.base_delay(a));
    }
}

#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn additive_start_that_grows_too_slowly_is_refused() {
    // ×1.0001 leaves 9 999 ns fixed (⌊9 999·1.0001⌋ = 9 999), but a jittered start of
    // 10 000 ns grows by 1 ns per attempt: to reach 14 097 ns it needs 4097 attempts.
    let slow = |max, range| {
        builder_ns(9_999, max)
            .multiplier(10_001, 10_000)
            .jitter(Jitter::Additive {
                range: Duration::from_nanos(range),
            })
            .build()
    };
    assert_eq!(slow(14_097, 1).map(|c| c.cap_attempt()), Ok(0));
    assert_eq!(
        slow(14_097, 2),
        Err(ConfigError::Invalid {
            option: &opt::JITTER,
            reason: "a jittered start grows too slowly: the delay must settle within \
                     4096 attempts",
        })
    );
    assert_eq!(
        slow(14_097, u64::MAX).map_err(|_| ()),
        Err(()),
        "a wider range reaches the slow start too"
    );
    // One nanosecond less settles in exactly 4096 attempts, and answers any attempt.
    let cfg = slow(14_096, 2).unwrap();
    let (b, first, rng) = sequence_with_offset(&cfg, 1);
    assert_eq!(first, 10_000);
    let at = |a| duration_to_nanos(b.delay_for(&cfg, a, &mut rng.clone()));
    assert_eq!(
        [at(1), at(4_095), at(4_096), at(u32::MAX)],
        [10_001, 14_095, 14_096, 14_096]
    );
    // A start already at or past the slow region is judged by the unjittered ramp alone.
    assert!(slow(14_097, 0).is_ok());
    let fast = builder_ns(10_000, 14_096)
        .multiplier(10_001, 10_000)
        .jitter(Jitter::Additive {
            range: Duration::MAX,
        })
        .build();
    assert!(fast.is_ok());
}

#[test]
fn additive_offsets_decorrelate_clients() {
    let cfg = BackoffConfig::gobblin_throttling_client();
    let firsts: Vec<u128> = (0..50)
        .map(|seed| {
            ms_of(
                Backoff::new()
                    .next_delay(&cfg, &mut SplitMix64::new(seed))
                    .unwrap(),
            )
        })
        .collect();
    assert!(firsts.iter().all(|&d| (500..1000).contains(&d)));
    let distinct = firsts
        .iter()
        .collect::<alloc::collections::BTreeSet<_>>()
        .len();
    assert!(
        distinct > 40,
        "clients do not retry in lockstep: {distinct} distinct"
    );
    // The offset covers its whole range evenly, not just its low end.
    let mut rng = SplitMix64::new(37);
    let starts: Vec<u128> = (0..1000)
        .map(|_| ms_of(cfg.delay_for(0, &mut rng)))
        .collect();
    let (upper, lo, hi) = spread(&starts, 750);
    assert!((400..600).contains(&upper), "{upper}/1000 above 750 ms");
    assert!(lo < 505 && hi > 995 && hi < 1_000, "{lo}..={hi} ms");
}

#[test]
fn backoff_delay_for_reuses_the_sequence_offset_and_matches_next_delay() {
    for cfg in [
        BackoffConfig::fluss_disk_write_locked(),
        BackoffConfig::grpc_connection(),
        BackoffConfig::gobblin_throttling_client(),
        BackoffConfig::builder()
            .jitter(Jitter::Decorrelated)
            .build()
            .unwrap(),
    ] {
        let mut rng = SplitMix64::new(21);
        let mut b = Backoff::new();
        for _ in 0..15 {
            let predicted = b.delay_for(&cfg, b.attempt(), &mut rng.clone());
            assert_eq!(b.next_delay(&cfg, &mut rng), Some(predicted));
        }
    }
    let cfg = BackoffConfig::gobblin_throttling_client();
    let mut rng = SplitMix64::new(4);
    let mut b = Backoff::new();
    b.next_delay(&cfg, &mut rng);
    let start = Duration::from_millis(500) + b.offset().unwrap();
    let d = b.delay_for(&cfg, 2, &mut rng);
    assert_eq!(d.as_millis(), (start * 4).as_millis());
    assert_eq!(b.attempt(), 1, "a query does not advance the sequence");
}

#[test]
fn floor_applies_after_jitter() {
    // 1 ms ±20 % could give 0.8 ms; the 1 ms floor lifts it (Fluss's smallest backoff).
    let cfg = BackoffConfig::fluss_disk_write_locked()
        .to_builder()
        .initial(Duration::from_millis(1))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(2);
    for _ in 0..500 {
        assert_eq!(cfg.delay_for(0, &mut rng), Duration::from_millis(1));
    }
    let full = builder_ns(1_000, 10_000)
        .jitter(Jitter::Full)
        .floor(Duration::from_nanos(700))
        .build()
        .unwrap();
    for _ in 0..500 {
        assert!(full.delay_for(0, &mut rng) >= Duration::from_nanos(700));
    }
}

#[test]
fn resolution_truncates_delays_down() {
    let cfg = builder_ns(1_500, 1_000_000)
        .multiplier(3, 1)
        .resolution(Duration::from_nanos(1_000))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(0);
    let mut b = Backoff::new();
    let got: Vec<u64> = (0..5)
        .map(|_| duration_to_nanos(b.next_delay(&cfg, &mut rng).unwrap()))
        .collect();
    // Bases 1500, 4500, 13500, 40500, 121500 ns.
    assert_eq!(got, [1_000, 4_000, 13_000, 40_000, 121_000]);
}

#[test]
fn initial_zero_disables_retriable_write_backoff() {
    let cfg = BackoffConfig::fluss_retriable_write()
        .to_builder()
        .initial(Duration::ZERO)
        .floor(Duration::from_millis(1))
        .total_budget(Some(Duration::ZERO))
        .build()
        .unwrap();
    assert!(cfg.is_disabled());
    assert!(!BackoffConfig::fluss_retriable_write().is_disabled());
    let mut rng = SplitMix64::new(1);
    let before = rng.clone();
    let mut b = Backoff::new();
    for _ in 0..5 {
        assert_eq!(b.next_delay(&cfg, &mut rng), Some(Duration::ZERO));
    }
    assert_eq!(cfg.delay_for(u32::MAX, &mut rng), Duration::ZERO);
    assert_eq!(b.attempt(), 5);
    assert_eq!(rng, before, "a disabled backoff draws nothing");
}

#[test]
fn attempt_u32_max_is_capped_and_bounded() {
    for cfg in [
        BackoffConfig::fluss_disk_write_locked(),
        BackoffConfig::fluss_retriable_write(),
        BackoffConfig::kafka_retry(),
        BackoffConfig::grpc_connection(),
        BackoffConfig::gobblin_throttling_client(),
    ] {
        let mut rng = SplitMix64::new(8);
        assert!(cfg.delay_for(u32::MAX, &mut rng) <= cfg.largest_delay());
        assert_eq!(cfg.base_delay(u32::MAX), cfg.max());
        assert_eq!(
            unjittered(cfg.clone()).delay_for(u32::MAX, &mut rng),
            cfg.max()
        );
    }
    // The slowest ramp allowed still answers any attempt in at most 4096 steps.
    let slow = builder_ns(10_000, 14_096)
        .multiplier(10_001, 10_000)
        .build()
        .unwrap();
    assert_eq!(slow.cap_attempt(), MAX_RAMP_ATTEMPTS);
    assert_eq!(slow.base_delay(4095), Duration::from_nanos(14_095));
    assert_eq!(slow.base_delay(u32::MAX), Duration::from_nanos(14_096));
}

#[test]
fn attempt_counter_saturates_at_u32_max() {
    let cfg = unjittered(BackoffConfig::kafka_retry());
    let mut b = Backoff {
        attempt: u32::MAX - 1,
        base: 1_000 * NS_PER_MS,
        prev: 1_000 * NS_PER_MS,
        ..Backoff::new()
    };
    let mut rng = SplitMix64::new(0);
    for _ in 0..3 {
        assert_eq!(b.next_delay(&cfg, &mut rng), Some(Duration::from_secs(1)));
    }
    assert_eq!(b.attempt(), u32::MAX);
}

#[test]
fn huge_values_saturate_instead_of_overflowing() {
    let cfg = BackoffConfig::builder()
        .initial(Duration::MAX)
        .max(Duration::MAX)
        .multiplier(u32::MAX, 1)
        .jitter(Jitter::Proportional { ppm: 1_000_000 })
        .resolution(Duration::from_nanos(1))
        .total_budget(Some(Duration::MAX))
        .build()
        .unwrap();
    assert_eq!(cfg.max(), Duration::from_nanos(u64::MAX));
    let mut rng = SplitMix64::new(1);
    let mut b = Backoff::new();
    let top = Some(Duration::from_nanos(u64::MAX));
    assert_eq!(b.next_delay(&cfg, &mut rng), top);
    assert_eq!(b.spent(), Duration::from_nanos(u64::MAX));
    assert_eq!(
        b.next_delay(&cfg, &mut rng),
        None,
        "the whole budget is spent"
    );
    let unbudgeted = cfg.to_builder().total_budget(None).build().unwrap();
    let mut b = Backoff::new();
    for _ in 0..10 {
        assert_eq!(b.next_delay(&unbudgeted, &mut rng), top);
    }
    assert_eq!(b.spent(), Duration::from_nanos(u64::MAX), "spent saturates");

    let grow = BackoffConfig::builder()
        .initial(Duration::from_nanos(3))
        .max(Duration::MAX)
        .multiplier(u32::MAX, 1)
        .jitter(Jitter::Additive {
            range: Duration::MAX,
        })
        .resolution(Duration::from_nanos(1))
        .build()
        .unwrap();
    assert_eq!(grow.base_delay(2), Duration::from_nanos(u64::MAX));
    for a in [0, 1, 2, u32::MAX] {
        assert!(grow.delay_for(a, &mut rng) >= grow.base_delay(a));
    }
    let deco = grow
        .to_builder()
        .jitter(Jitter::Decorrelated)
        .build()
        .unwrap();
    let mut b = Backoff::new();
    for _ in 0..70 {
        assert!(b.next_delay(&deco, &mut rng).is_some());
    }
}

#[test]
fn budget_refuses_a_delay_larger_than_what_is_left() {
    // Gobblin's maxWait would let the crossing wait run; ours refuses it.
    let cfg = unjittered(BackoffConfig::fluss_disk_write_locked())
        .to_builder()
        .total_budget(Some(Duration::from_millis(3_500)))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(0);
    let mut b = Backoff::new();
    assert_eq!(b.next_delay(&cfg, &mut rng), Some(Duration::from_secs(1)));
    assert_eq!(b.next_delay(&cfg, &mut rng), Some(Duration::from_secs(2)));
    assert_eq!(b.remaining_budget(&cfg), Some(Duration::from_millis(500)));
    let before = b.clone();
    assert_eq!(
        b.next_delay(&cfg, &mut rng),
        None,
        "4 s exceeds the 0.5 s left"
    );
    assert!(b.is_exhausted());
    assert_eq!((b.attempt(), b.spent()), (before.attempt(), before.spent()));
    assert_eq!(b.next_delay(&cfg, &mut rng), None, "the refusal sticks");
    b.reset();
    assert_eq!(b.next_delay(&cfg, &mut rng), Some(Duration::from_secs(1)));
    assert_eq!(b.remaining_budget(&BackoffConfig::default()), None);
}

#[test]
fn budget_allows_a_delay_equal_to_what_is_left() {
    let cfg = unjittered(BackoffConfig::kafka_retry())
        .to_builder()
        .total_budget(Some(Duration::from_millis(300)))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(0);
    let mut b = Backoff::new();
    assert_eq!(
        b.next_delay(&cfg, &mut rng),
        Some(Duration::from_millis(100))
    );
    assert_eq!(
        b.next_delay(&cfg, &mut rng),
        Some(Duration::from_millis(200))
    );
    assert_eq!(b.remaining_budget(&cfg), Some(Duration::ZERO));
    assert_eq!(b.next_delay(&cfg, &mut rng), None);
}

#[test]
fn fluss_bounds_are_exact_in_nanoseconds() {
    let disk = BackoffConfig::fluss_disk_write_locked().to_builder();
    // 999 999 ns is below 1 ms: refused before any truncation could round it.
    assert_eq!(
        disk.clone().initial(Duration::from_nanos(999_999)).build(),
        Err(ConfigError::OutOfRange {
            option: &opt::FLUSS_DISK_INITIAL,
            got: 999_999,
            min: 1_000_000,
            max: FLUSS_MAX_NS,
            unit: "ns",
        })
    );
    assert!(
        disk.clone()
            .initial(Duration::from_millis(1))
            .build()
            .is_ok()
    );
    let top = Duration::from_millis(2_147_483_647);
    assert!(disk.clone().max(top).build().is_ok());
    assert_eq!(
        disk.clone().max(top + Duration::from_nanos(1)).validate(),
        Err(ConfigError::OutOfRange {
            option: &opt::FLUSS_DISK_MAX,
            got: FLUSS_MAX_NS + 1,
            min: 1_000_000,
            max: FLUSS_MAX_NS,
            unit: "ns",
        })
    );
    let retry = BackoffConfig::fluss_retriable_write().to_builder();
    assert!(retry.clone().initial(Duration::ZERO).build().is_ok());
    assert!(retry.clone().max(top).build().is_ok());
    assert!(retry.max(top + Duration::from_nanos(1)).build().is_err());
    // General rules have no such bounds.
    assert!(
        BackoffConfig::builder()
            .initial(Duration::ZERO)
            .build()
            .is_ok()
    );
    assert!(BackoffConfig::builder().max(Duration::MAX).build().is_ok());
}

#[test]
fn general_validation_edges() {
    let b = || builder_ns(1_000, 2_000);
    assert!(b().initial(Duration::from_nanos(2_000)).build().is_ok());
    assert_eq!(
        b().initial(Duration::from_nanos(2_001)).build(),
        Err(ConfigError::Inverted {
            option: &opt::INITIAL,
            limit: &opt::MAX
        })
    );
    assert!(b().multiplier(7, 7).build().is_ok());
    assert!(matches!(
        b().multiplier(6, 7).build(),
        Err(ConfigError::Invalid {
            option: &opt::MULTIPLIER,
            ..
        })
    ));
    assert!(matches!(
        b().multiplier(0, 0).build(),
        Err(ConfigError::Invalid {
            option: &opt::MULTIPLIER,
            ..
        })
    ));
    assert!(
        b().jitter(Jitter::Proportional { ppm: 1_000_000 })
            .build()
            .is_ok()
    );
    assert_eq!(
        b().jitter(Jitter::Proportional { ppm: 1_000_001 }).build(),
        Err(ConfigError::OutOfRange {
            option: &opt::JITTER,
            got: 1_000_001,
            min: 0,
            max: 1_000_000,
            unit: "ppm",
        })
    );
    assert!(b().floor(Duration::from_nanos(2_000)).build().is_ok());
    assert_eq!(
        b().floor(Duration::from_nanos(2_001)).build(),
        Err(ConfigError::Inverted {
            option: &opt::FLOOR,
            limit: &opt::MAX
        })
    );
    let coarse = b().resolution(Duration::from_nanos(500));
    assert!(
        coarse
            .clone()
            .floor(Duration::from_nanos(1_500))
            .build()
            .is_ok()
    );
    assert!(matches!(
        coarse.floor(Duration::from_nanos(1_501)).build(),
        Err(ConfigError::Invalid {
            option: &opt::FLOOR,
            ..
        })
    ));
    assert!(b().resolution(Duration::from_nanos(1)).build().is_ok());
    assert!(matches!(
        b().resolution(Duration::ZERO).build(),
        Err(ConfigError::OutOfRange {
            option: &opt::RESOLUTION,
            got: 0,
            min: 1,
            ..
        })
    ));
}

#[test]
fn multiplier_that_settles_after_4096_attempts_is_refused() {
    // ×1.0001 from 10 µs grows by exactly 1 ns per attempt here.
    let slow = |max| builder_ns(10_000, max).multiplier(10_001, 10_000).build();
    assert_eq!(slow(14_096).map(|c| c.cap_attempt()), Ok(4096));
    assert_eq!(
        slow(14_097),
        Err(ConfigError::Invalid {
            option: &opt::MULTIPLIER,
            reason: "grows too slowly: the delay must settle within 4096 attempts",
        })
    );
    // Too small to grow at all (⌊9·1.1⌋ = 9) is a fixed point, not a slow ramp.
    let stuck = builder_ns(9, u64::MAX).multiplier(11, 10).build().unwrap();
    assert_eq!(stuck.cap_attempt(), 0);
    assert_eq!(stuck.base_delay(u32::MAX), Duration::from_nanos(9));
}

#[test]
fn enabled_config_with_max_below_resolution_is_refused() {
    // 500 µs..900 µs on the 1 ms grid would truncate every delay to zero.
    for (b, option, limit) in [
        (BackoffConfig::builder(), &opt::RESOLUTION, &opt::MAX),
        (
            BackoffConfig::fluss_retriable_write().to_builder(),
            &opt::RESOLUTION,
            &opt::FLUSS_RETRY_MAX,
        ),
        (
            BackoffConfig::kafka_retry().to_builder(),
            &opt::RESOLUTION,
            &opt::KAFKA_MAX,
        ),
    ] {
        let sub = b.initial(Duration::from_micros(500));
        assert_eq!(
            sub.clone().max(Duration::from_micros(900)).build(),
            Err(ConfigError::Inverted { option, limit })
        );
        // The exact edge: max one nanosecond below the 1 ms step is refused, 1 ms is not.
        let just_below = sub.clone().max(Duration::from_nanos(999_999)).build();
        assert_eq!(just_below, Err(ConfigError::Inverted { option, limit }));
        let at_step = sub.clone().max(Duration::from_millis(1)).build().unwrap();
        let mut rng = SplitMix64::new(1);
        let mut seq = Backoff::new();
        for _ in 0..5 {
            let d = seq.next_delay(&at_step, &mut rng);
            assert_eq!(d, Some(Duration::from_millis(1)), "lifted to one step");
        }
        // A disabled config hands out zero by definition; its max is not checked.
        let off = sub.initial(Duration::ZERO).max(Duration::from_micros(900));
        assert!(off.build().is_ok_and(|c| c.is_disabled()));
    }
    let coarse = builder_ns(5, 10).resolution(Duration::from_nanos(11));
    assert!(coarse.clone().build().is_err());
    assert!(coarse.max(Duration::from_nanos(11)).build().is_ok());
}

#[test]
fn enabled_backoff_never_hands_out_a_zero_delay() {
    // Each of these can draw a raw delay below the 1 ms step: ±20 % of 1 ms (0.8 ms),
    // ±100 %, full jitter, equal jitter of 1 ms (0.5 ms), an initial of 1 ns, and a
    // decorrelated start below the step. Upstream Kafka would truncate 0.8 ms to 0.
    let ms1 = Duration::from_millis(1);
    let cfgs = [
        BackoffConfig::kafka_retry().to_builder().initial(ms1),
        BackoffConfig::builder()
            .initial(ms1)
            .jitter(Jitter::Proportional { ppm: 1_000_000 }),
        BackoffConfig::builder().initial(ms1).jitter(Jitter::Full),
        BackoffConfig::builder().initial(ms1).jitter(Jitter::Equal),
        BackoffConfig::builder()
            .initial(Duration::from_nanos(1))
            .jitter(Jitter::None),
        BackoffConfig::builder()
            .initial(Duration::from_nanos(1))
            .jitter(Jitter::Decorrelated),
    ];
    for b in cfgs {
        let cfg = b.build().unwrap();
        let mut rng = SplitMix64::new(41);
        for _ in 0..200 {
            let mut seq = Backoff::new();
            let d = seq.next_delay(&cfg, &mut rng).unwrap();
            assert!(d >= ms1, "{d:?} from {:?}", cfg.jitter());
            assert!(cfg.delay_for(0, &mut rng) >= ms1);
        }
    }
}

#[test]
fn validation_names_the_preset_option() {
    let e = BackoffConfig::grpc_connection()
        .to_builder()
        .multiplier(1, 2)
        .build()
        .unwrap_err();
    assert_eq!(
        alloc::string::ToString::to_string(&e),
        "`multiplier`: must be at least 1 (num >= den): a backoff never shrinks (docs/design.md), \
         a deliberate departure from gRFC A6, which allows multipliers below 1 \
         (`BackoffConfigBuilder::multiplier`; gRPC `MULTIPLIER`)"
    );
}

/// The division-free arithmetic against the plain `u128` formulas it replaced (`/`, `%`,
/// clamp then truncate), bit for bit and draw for draw.
mod division_free;

/// The delays `next_delay` hands out until it refuses (at most 20), in ms.
fn delays_ms(cfg: &BackoffConfig, b: &mut Backoff, rng: &mut SplitMix64) -> Vec<u128> {
    (0..20)
        .map_while(|_| b.next_delay(cfg, rng))
        .map(ms_of)
        .collect()
}

#[test]
fn max_attempts_refuses_the_delay_after_the_nth_without_drawing() {
    // Gobblin `maxRetries` 3: the 4th `awaitNextRetry` throws.
    let cfg = BackoffConfig::kafka_retry()
        .to_builder()
        .max_attempts(Some(3))
        .build()
        .unwrap();
    assert_eq!(cfg.max_attempts(), Some(3));
    let mut rng = SplitMix64::new(4);
    let mut b = Backoff::new();
    assert_eq!(delays_ms(&cfg, &mut b, &mut rng).len(), 3);
    assert_eq!(b.exhausted(), Some(Exhausted::Attempts));
    let before = rng.clone();
    assert_eq!(b.next_delay(&cfg, &mut rng), None, "the refusal sticks");
    assert_eq!(rng, before, "a refused attempt draws nothing");
    b.reset();
    assert_eq!(b.exhausted(), None);
    assert!(b.next_delay(&cfg, &mut rng).is_some());
    // Zero retries: the first delay is refused.
    let none = cfg.to_builder().max_attempts(Some(0)).build().unwrap();
    assert_eq!(Backoff::new().next_delay(&none, &mut rng), None);
}

#[test]
fn soft_max_wait_lets_the_crossing_delay_run_where_the_hard_budget_refuses_it() {
    // 1, 2, 4 s… Gobblin `maxWait` 3 s: after 1 + 2 = 3 s, `totalWait > maxWait` is false, so
    // the 4 s wait still runs (7 s in all); only the next one is refused.
    let base = unjittered(BackoffConfig::fluss_disk_write_locked());
    let soft = base
        .to_builder()
        .max_wait(Some(Duration::from_secs(3)))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(0);
    let mut b = Backoff::new();
    assert_eq!(delays_ms(&soft, &mut b, &mut rng), [1_000, 2_000, 4_000]);
    assert_eq!(b.exhausted(), Some(Exhausted::MaxWait));
    assert_eq!(b.spent(), Duration::from_secs(7));
    // 1 ms under: 1 + 2 = 3 s is more than 2.999 s, so the 4 s delay is refused.
    let tighter = soft
        .to_builder()
        .max_wait(Some(Duration::from_millis(2_999)))
        .build()
        .unwrap();
    let mut b = Backoff::new();
    assert_eq!(delays_ms(&tighter, &mut b, &mut rng), [1_000, 2_000]);
    // The hard budget of the same 3 s never lets the total pass it.
    let hard = base
        .to_builder()
        .total_budget(Some(Duration::from_secs(3)))
        .build()
        .unwrap();
    let mut b = Backoff::new();
    assert_eq!(delays_ms(&hard, &mut b, &mut rng), [1_000, 2_000]);
    assert_eq!(b.exhausted(), Some(Exhausted::Budget));
}

#[test]
fn attempts_are_checked_before_max_wait_and_both_before_the_budget() {
    let cfg = unjittered(BackoffConfig::kafka_retry())
        .to_builder()
        .max_attempts(Some(1))
        .max_wait(Some(Duration::ZERO))
        .total_budget(Some(Duration::from_millis(100)))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(0);
    let mut b = Backoff::new();
    assert_eq!(
        b.next_delay(&cfg, &mut rng),
        Some(Duration::from_millis(100))
    );
    assert_eq!(b.next_delay(&cfg, &mut rng), None);
    assert_eq!(b.exhausted(), Some(Exhausted::Attempts));
    let wait = cfg.to_builder().max_attempts(None).build().unwrap();
    let mut b = Backoff::new();
    assert!(b.next_delay(&wait, &mut rng).is_some());
    assert_eq!(b.next_delay(&wait, &mut rng), None);
    assert_eq!(b.exhausted(), Some(Exhausted::MaxWait));
}

// ---- Issue 15: jitter order, gRPC connection rules, per-delay jitter, extremes ----

/// `⌊base·f/10⁶⌋` truncated to `res` ns, the exact proportional or per-delay draw.
fn scaled(base: u64, factor: u64, res: u64) -> u64 {
    let v = u64::try_from(u128::from(base) * u128::from(factor) / u128::from(PPM)).unwrap();
    v - v % res
}

#[test]
fn grpc_connection_waits_exactly_initial_backoff_first_and_draws_nothing() {
    // grpc/grpc doc/connection-backoff.md, "Proposed Backoff Algorithm":
    // `current_deadline = now() + INITIAL_BACKOFF` before the first attempt, no jitter.
    let cfg = BackoffConfig::grpc_connection();
    assert!(cfg.first_delay_unjittered());
    for seed in 0..50 {
        let mut rng = SplitMix64::new(seed);
        let before = rng.clone();
        let mut b = Backoff::new();
        assert_eq!(b.next_delay(&cfg, &mut rng), Some(Duration::from_secs(1)));
        assert_eq!(rng, before, "the first wait draws nothing");
        assert_eq!(cfg.delay_for(0, &mut rng), Duration::from_secs(1));
        assert_eq!(b.delay_for(&cfg, 0, &mut rng), Duration::from_secs(1));
        assert_eq!(rng, before);
        // The second wait: min(1 s·1.6, 120 s) ± 20 %, exactly the drawn factor.
        let factor = 800_000 + below(&mut rng.clone(), 400_000);
        let d = b.next_delay(&cfg, &mut rng).unwrap();
        assert_eq!(
            duration_to_nanos(d),
            scaled(1_600 * NS_PER_MS, factor, NS_PER_MS)
        );
        assert!((1_280..1_920).contains(&d.as_millis()), "{d:?}");
    }
    // The option is what makes the difference: without it the first wait is jittered.
    let jittered = cfg
        .to_builder()
        .first_delay_unjittered(false)
        .build()
        .unwrap();
    let firsts: Vec<_> = (0..20)
        .map(|seed| Backoff::new().next_delay(&jittered, &mut SplitMix64::new(seed)))
        .collect();
    assert!(firsts.iter().any(|d| *d != Some(Duration::from_secs(1))));
}

#[test]
#[cfg_attr(miri, ignore)] // a distribution's shape, over 1,000s of draws: natively only
fn grpc_connection_jitters_after_the_cap_so_capped_waits_spread_over_96_to_144_s() {
    // grpc/grpc doc/connection-backoff.md: `current_backoff = Min(current_backoff *
    // MULTIPLIER, MAX_BACKOFF)`, then `+ UniformRandom(-JITTER * current_backoff, JITTER *
    // current_backoff)` with MAX_BACKOFF = 120 s, JITTER = 0.2: 96–144 s at the cap.
    let cfg = BackoffConfig::grpc_connection();
    assert_eq!(cfg.jitter_order(), JitterOrder::CapThenJitter);
    let mut rng = SplitMix64::new(15);
    let mut b = Backoff::new();
    for _ in 0..cfg.cap_attempt() {
        b.next_delay(&cfg, &mut rng).unwrap();
    }
    let (mut above, mut below_cap) = (0, 0);
    for _ in 0..2_000 {
        let factor = 800_000 + below(&mut rng.clone(), 400_000);
        let d = b.next_delay(&cfg, &mut rng).unwrap();
        assert_eq!(
            duration_to_nanos(d),
            scaled(120_000 * NS_PER_MS, factor, NS_PER_MS)
        );
        assert!((96_000..144_000).contains(&d.as_millis()), "{d:?}");
        above += usize::from(d > cfg.max());
        below_cap += usize::from(d < cfg.max());
    }
    // Both halves of the spread occur: waits at the cap exceed MAX_BACKOFF about half the time.
    assert!(
        above > 800 && below_cap > 800,
        "{above} above, {below_cap} below"
    );
    assert_eq!(cfg.largest_delay(), Duration::from_millis(143_999));
}

#[test]
fn only_grpc_connection_skips_the_first_draw() {
    for other in [
        BackoffConfig::fluss_disk_write_locked(),
        BackoffConfig::fluss_retriable_write(),
        BackoffConfig::kafka_retry(),
        BackoffConfig::gobblin_throttling_client(),
        BackoffConfig::builder().build().unwrap(),
    ] {
        assert!(!other.first_delay_unjittered());
    }
    assert!(BackoffConfig::grpc_connection().first_delay_unjittered());
}

#[test]
fn fluss_kafka_and_gobblin_keep_max_including_jitter() {
    // Fluss: "max includes jitter". Kafka ExponentialBackoff.backoff (apache/kafka
    // clients/.../utils/ExponentialBackoff.java) returns `Math.min(backoffValue,
    // maxInterval)` after the random factor: jitter then cap. Gobblin's jittered start grows
    // inside `maxDelay`.
    for cfg in [
        BackoffConfig::fluss_disk_write_locked(),
        BackoffConfig::fluss_retriable_write(),
        BackoffConfig::kafka_retry(),
        BackoffConfig::gobblin_throttling_client(),
    ] {
        assert_eq!(cfg.jitter_order(), JitterOrder::JitterThenCap);
        assert_eq!(cfg.largest_delay(), cfg.max());
        let mut rng = SplitMix64::new(3);
        let mut b = Backoff::new();
        for _ in 0..200 {
            assert!(b.next_delay(&cfg, &mut rng).unwrap() <= cfg.max());
        }
    }
    // Kafka at its 1 s cap: 0.8–1.0 s, never above (the clamp after the factor).
    let kafka = BackoffConfig::kafka_retry();
    let mut rng = SplitMix64::new(9);
    let mut b = Backoff::new();
    let capped: Vec<_> = (0..300)
        .map(|_| b.next_delay(&kafka, &mut rng).unwrap().as_millis())
        .skip(10)
        .collect();
    assert!(capped.iter().all(|ms| (800..=1_000).contains(ms)));
    assert!(capped.iter().filter(|ms| **ms == 1_000).count() > 100);
}

#[test]
fn cap_then_jitter_is_min_of_growth_and_max_times_0_8_to_1_2() {
    // Issue 15's statement of the retry backoff, `min(initial·mult^(n−1), max) · U(0.8, 1.2)`
    // (gRFC A6's own text, 2017, draws full jitter under the capped base instead; see
    // docs/backoff.md, "gRPC service config"), with
    // A6's example policy `initialBackoff ".1s"`, `maxBackoff "1s"`, `backoffMultiplier 2`.
    let cfg = BackoffConfig::builder()
        .initial(Duration::from_millis(100))
        .max(Duration::from_secs(1))
        .jitter_order(JitterOrder::CapThenJitter)
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(6);
    let mut b = Backoff::new();
    for n in 1..=40u32 {
        let base = ((100 * NS_PER_MS) << (n - 1).min(4)).min(1_000 * NS_PER_MS);
        let factor = 800_000 + below(&mut rng.clone(), 400_000);
        let d = b.next_delay(&cfg, &mut rng).unwrap();
        assert_eq!(
            duration_to_nanos(d),
            scaled(base, factor, NS_PER_MS),
            "n = {n}"
        );
    }
    // The same config with jitter then cap never passes 1 s.
    let fluss_order = cfg
        .to_builder()
        .jitter_order(JitterOrder::JitterThenCap)
        .build()
        .unwrap();
    assert_eq!(fluss_order.largest_delay(), Duration::from_secs(1));
    assert_eq!(cfg.largest_delay(), Duration::from_millis(1_199));
}

#[test]
fn cap_then_jitter_makes_no_difference_to_draws_at_or_below_the_base() {
    // Full, equal and no jitter never exceed the capped base, so both orders agree draw for
    // draw.
    for jitter in [Jitter::None, Jitter::Full, Jitter::Equal] {
        let a = BackoffConfig::builder().jitter(jitter).build().unwrap();
        let c = a
            .to_builder()
            .jitter_order(JitterOrder::CapThenJitter)
            .build()
            .unwrap();
        assert_eq!(sequence_ms(&a, 40, 2), sequence_ms(&c, 40, 2), "{jitter:?}");
    }
}

#[test]
fn cap_then_jitter_and_an_unjittered_first_delay_refuse_strategies_they_cannot_mean() {
    let additive = Jitter::Additive {
        range: Duration::from_millis(5),
    };
    for jitter in [additive, Jitter::Decorrelated] {
        let e = BackoffConfig::builder()
            .jitter(jitter)
            .jitter_order(JitterOrder::CapThenJitter)
            .build()
            .unwrap_err();
        assert_eq!(e.option(), &opt::JITTER_ORDER, "{jitter:?}");
        assert!(matches!(e, ConfigError::Invalid { .. }));
    }
    let e = BackoffConfig::builder()
        .jitter(additive)
        .first_delay_unjittered(true)
        .build()
        .unwrap_err();
    assert_eq!(e.option(), &opt::FIRST_DELAY_UNJITTERED);
    // Decorrelated jitter may start unjittered: its first delay is then `initial`.
    let d = BackoffConfig::builder()
        .jitter(Jitter::Decorrelated)
        .first_delay_unjittered(true)
        .build()
        .unwrap();
    assert_eq!(sequence_ms(&d, 1, 4), [1_000]);
}

#[test]
fn per_delay_jitter_draws_backons_d_to_2d_independently_for_every_delay() {
    // backon (Xuanwo/backon backon/src/backoff/exponential.rs): with_jitter adds
    // `tmp_cur.mul_f32(rng.f32())` to every delay after the cap, so `test_exponential_jitter`
    // (defaults min 1 s, factor 2, max 60 s) sees [1, 2), [2, 4), [4, 8) s.
    let cfg = BackoffConfig::builder()
        .initial(Duration::from_secs(1))
        .max(Duration::from_secs(60))
        .jitter(Jitter::PerDelay { ppm: 1_000_000 })
        .jitter_order(JitterOrder::CapThenJitter)
        .resolution(Duration::from_nanos(1))
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(21);
    let mut b = Backoff::new();
    let mut ratios = Vec::new();
    for n in 0..30u32 {
        let base = ((1_000 * NS_PER_MS) << n.min(6)).min(60_000 * NS_PER_MS);
        let factor = PPM + below(&mut rng.clone(), PPM);
        let d = duration_to_nanos(b.next_delay(&cfg, &mut rng).unwrap());
        assert_eq!(d, scaled(base, factor, 1), "attempt {n}");
        assert!(base <= d && d < 2 * base);
        ratios.push(d * 1_000 / base);
    }
    assert_eq!(b.offset(), None, "nothing is drawn once per sequence");
    ratios.sort_unstable();
    ratios.dedup();
    assert!(
        ratios.len() > 20,
        "each delay draws its own factor: {ratios:?}"
    );
    // At the 60 s cap backon's jitter passes the cap: up to 120 s.
    assert_eq!(cfg.largest_delay(), Duration::from_nanos(119_999_940_000));
}

#[test]
fn per_delay_jitter_with_jitter_then_cap_is_towers_exponential_backoff() {
    // tower (tower-rs/tower tower/src/retry/backoff.rs): `next = base + jitter(base)`, the
    // jitter `base·j·U[0, 1)` clamped to `max − base`; the maker refuses j > 100.
    let cfg = BackoffConfig::builder()
        .initial(Duration::from_millis(50))
        .max(Duration::from_secs(2))
        .jitter(Jitter::PerDelay { ppm: 990_000 })
        .build()
        .unwrap();
    let mut rng = SplitMix64::new(22);
    let mut b = Backoff::new();
    for n in 0..20u32 {
        let base = ((50 * NS_PER_MS) << n.min(6)).min(2_000 * NS_PER_MS);
        let factor = PPM + below(&mut rng.clone(), 990_000);
        let d = duration_to_nanos(b.next_delay(&cfg, &mut rng).unwrap());
        assert_eq!(d, scaled(base, factor, NS_PER_MS).min(2_000 * NS_PER_MS));
    }
    assert!(
        BackoffConfig::builder()
            .jitter(Jitter::PerDelay { ppm: 100_000_000 })
            .build()
            .is_ok()
    );
    let e = BackoffConfig::builder()
        .jitter(Jitter::PerDelay { ppm: 100_000_001 })
        .build()
        .unwrap_err();
    assert!(matches!(
        e,
        ConfigError::OutOfRange {
            got: 100_000_001,
            max: 100_000_000,
            ..
        }
    ));
    // A fixed per-delay backoff still jitters (upward), unlike a fixed proportional one.
    let fixed = BackoffConfig::builder()
        .initial(Duration::from_secs(1))
        .max(Duration::from_secs(1))
        .jitter(Jitter::PerDelay { ppm: 500_000 })
        .jitter_order(JitterOrder::CapThenJitter)
        .build()
        .unwrap();
    assert!(sequence_ms(&fixed, 20, 5).iter().any(|ms| *ms > 1_000));
}

#[test]
fn extremes_saturate_at_u64_max_nanoseconds() {
    // The saturation point is `u64::MAX` ns (584 years, 171 days, 23 h 34 min 33.709551615 s):
    // `Duration::MAX` and anything above `u64::MAX` ns is read as it.
    let top = Duration::from_nanos(u64::MAX);
    assert_eq!(top.as_secs(), 18_446_744_073);
    let cfg = BackoffConfig::builder()
        .initial(Duration::from_nanos(1))
        .max(Duration::MAX)
        .multiplier(u32::MAX, 1)
        .resolution(Duration::from_nanos(1))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    assert_eq!(cfg.max(), top);
    // 1, 2³²−1, (2³²−1)², then saturated: three steps to the cap.
    assert_eq!(cfg.base_delay(1), Duration::from_nanos(u64::from(u32::MAX)));
    assert_eq!(cfg.base_delay(3), top);
    assert_eq!(cfg.base_delay(u32::MAX), top);
    assert_eq!(cfg.cap_attempt(), 3);
    let mut rng = SplitMix64::new(1);
    let mut b = Backoff::new();
    for _ in 0..5 {
        b.next_delay(&cfg, &mut rng).unwrap();
    }
    assert_eq!(b.spent(), top, "the spent sum saturates too");
    // Jitter above a saturated base saturates, in either order and for every widening draw.
    for (jitter, order) in [
        (
            Jitter::Proportional { ppm: 1_000_000 },
            JitterOrder::CapThenJitter,
        ),
        (
            Jitter::PerDelay { ppm: 100_000_000 },
            JitterOrder::CapThenJitter,
        ),
        (
            Jitter::PerDelay { ppm: 100_000_000 },
            JitterOrder::JitterThenCap,
        ),
        (Jitter::Decorrelated, JitterOrder::JitterThenCap),
    ] {
        let c = cfg
            .to_builder()
            .jitter(jitter)
            .jitter_order(order)
            .build()
            .unwrap();
        let mut b = Backoff::new();
        let mut rng = SplitMix64::new(2);
        for _ in 0..50 {
            assert!(b.next_delay(&c, &mut rng).unwrap() <= top);
        }
        assert!(c.delay_for(u32::MAX, &mut rng) <= top);
        assert!(c.largest_delay() <= top);
    }
    // The attempt counter saturates at u32::MAX: the delay stays the cap's.
    let mut b = Backoff {
        attempt: u32::MAX,
        base: u64::MAX,
        prev: u64::MAX,
        ..Backoff::new()
    };
    assert_eq!(b.next_delay(&cfg, &mut rng), Some(top));
    assert_eq!(b.attempt(), u32::MAX);
}

/// Built in a `const`: the gRPC connection preset's options, through the general builder.
const GRPC_LIKE: BackoffConfigBuilder = BackoffConfig::builder()
    .initial(Duration::from_secs(1))
    .max(Duration::from_secs(120))
    .multiplier(16, 10)
    .jitter(Jitter::Proportional { ppm: 200_000 })
    .jitter_order(JitterOrder::CapThenJitter)
    .first_delay_unjittered(true);

/// `Duration::MAX` in a `const` saturates at `u64::MAX` ns like the run-time setters.
const HUGE: BackoffConfigBuilder = BackoffConfig::builder()
    .max(Duration::MAX)
    // 1 s past the saturation point (`Duration::MAX` wraps to `u64::MAX` by chance).
    .total_budget(Some(Duration::from_secs(18_446_744_074)))
    .max_wait(Some(Duration::from_secs(30)))
    .max_attempts(Some(7))
    .floor(Duration::from_millis(2))
    .resolution(Duration::from_millis(1));

#[test]
fn const_builders_give_the_same_configs_as_run_time_ones() {
    let cfg = GRPC_LIKE.build().unwrap();
    let preset = BackoffConfig::grpc_connection();
    assert_eq!(
        (cfg.initial(), cfg.max(), cfg.multiplier(), cfg.jitter()),
        (
            preset.initial(),
            preset.max(),
            preset.multiplier(),
            preset.jitter()
        )
    );
    assert_eq!(
        (cfg.jitter_order(), cfg.first_delay_unjittered()),
        (preset.jitter_order(), preset.first_delay_unjittered())
    );
    assert_eq!(sequence_ms(&cfg, 40, 11), sequence_ms(&preset, 40, 11));
    let huge = HUGE.build().unwrap();
    let run_time = BackoffConfig::builder()
        .max(Duration::MAX)
        .total_budget(Some(Duration::from_secs(18_446_744_074)))
        .max_wait(Some(Duration::from_secs(30)))
        .max_attempts(Some(7))
        .floor(Duration::from_millis(2))
        .resolution(Duration::from_millis(1))
        .build()
        .unwrap();
    assert_eq!(huge, run_time);
    assert_eq!(huge.max(), Duration::from_nanos(u64::MAX));
    assert_eq!(huge.total_budget(), Some(Duration::from_nanos(u64::MAX)));
}
