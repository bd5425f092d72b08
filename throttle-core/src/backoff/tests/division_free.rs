use super::*;
use proptest::prelude::*;

/// `⌊a·b/c⌋` in `u128`, saturating: the formula before the rewrite.
fn ref_mul_div(a: u64, b: u64, c: u64) -> u64 {
    u64::try_from(u128::from(a) * u128::from(b) / u128::from(c)).unwrap_or(u64::MAX)
}

fn ref_grow(d: u64, cfg: &BackoffConfig) -> u64 {
    ref_mul_div(d, u64::from(cfg.num), u64::from(cfg.den)).min(cfg.max)
}

/// Clamp to `max`, floor, truncate with `%`, at least one step.
fn ref_finish(cfg: &BackoffConfig, raw: u64) -> u64 {
    let v = raw.min(cfg.max).max(cfg.floor);
    (v - v % cfg.resolution).max(cfg.resolution)
}

/// Steps 2–4 for `Jitter::Proportional` as written before the rewrite.
fn ref_draw(cfg: &BackoffConfig, base: u64, rng: &mut SplitMix64) -> u64 {
    let Jitter::Proportional { ppm } = cfg.jitter else {
        unreachable!("proportional configs only");
    };
    if cfg.initial == 0 {
        return 0;
    }
    let raw = if cfg.initial == cfg.max {
        base
    } else {
        let half = u64::from(ppm).min(PPM);
        let factor = PPM - half + below(rng, 2 * half);
        ref_mul_div(base, factor, PPM)
    };
    ref_finish(cfg, raw)
}

/// `next_delay` as written before the rewrite (the bookkeeping, unchanged, is shared).
fn ref_next(cfg: &BackoffConfig, b: &mut Backoff, rng: &mut SplitMix64) -> Option<u64> {
    if b.exhausted.is_some() {
        return None;
    }
    let base = if b.attempt == 0 {
        cfg.initial
    } else {
        ref_grow(b.base, cfg)
    };
    let delay = ref_draw(cfg, base, rng);
    b.hand_out(cfg, base, delay).map(duration_to_nanos)
}

/// Any width is equally likely, plus both ends.
fn wide() -> impl Strategy<Value = u64> {
    prop_oneof![
        (any::<u64>(), 0u32..64).prop_map(|(x, s)| x >> s),
        Just(u64::MAX),
        Just(0),
    ]
}

fn resolution() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(1),
        Just(7),
        Just(NS_PER_MS),
        Just(999_999),
        // 10⁶·res past u64: the saturated unit of `draw_spread` (2^58·10⁶ would
        // wrap to 0).
        Just(1 << 45),
        Just(1 << 58),
        (1u64 << 44)..=u64::MAX,
        1..=u64::from(u32::MAX),
    ]
}

fn multiplier() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![
        Just((2, 1)),
        Just((3, 2)),
        Just((16, 10)),
        Just((u32::MAX, 1)),
        Just((u32::MAX, u32::MAX / 2)),
        (1u32..1_000, 0u32..4).prop_map(|(den, k)| (den * (k + 1) + k, den)),
    ]
}

/// Valid proportional configs over the whole range: any initial and max, whole and
/// fractional multipliers, fine, odd, 1 ms and huge resolutions, floors and budgets.
fn proportional_config() -> impl Strategy<Value = BackoffConfig> {
    (
        (wide(), wide(), resolution()),
        (multiplier(), 0u32..=1_000_001, 0u64..4),
        proptest::option::of(wide()),
    )
        .prop_filter_map(
            "valid config",
            |((a, b, res), ((num, den), ppm, k), budget)| {
                let max = a.max(b).max(res);
                BackoffConfig::builder()
                    .initial(Duration::from_nanos(a.min(b)))
                    .max(Duration::from_nanos(max))
                    .multiplier(num, den)
                    .jitter(Jitter::Proportional { ppm })
                    .resolution(Duration::from_nanos(res))
                    .floor(Duration::from_nanos(
                        res.saturating_mul(k).min(max / res * res),
                    ))
                    .total_budget(budget.map(Duration::from_nanos))
                    .build()
                    .ok()
            },
        )
}

proptest! {
    #![proptest_config(crate::proptest_config(4_000))]

    #[test]
    fn growth_matches_the_u128_formula_for_any_base(
        cfg in proportional_config(),
        d in wide(),
    ) {
        prop_assert_eq!(cfg.next_base(d), ref_grow(d, &cfg));
        prop_assert_eq!(grow(d, cfg.num, cfg.den_div, cfg.max), ref_grow(d, &cfg));
        // The settled shortcut is exact: `settled` is a fixed point.
        prop_assert_eq!(ref_grow(cfg.settled, &cfg), cfg.settled);
    }

    #[test]
    fn proportional_draw_matches_the_u128_formula_draw_for_draw(
        cfg in proportional_config(),
        base in wide(),
        seed in any::<u64>(),
    ) {
        let (mut got_rng, mut want_rng) = (SplitMix64::new(seed), SplitMix64::new(seed));
        let got = cfg.draw(base, 0, &mut got_rng);
        prop_assert_eq!(got, ref_draw(&cfg, base, &mut want_rng));
        prop_assert_eq!(got_rng, want_rng, "same RNG consumption");
    }

    #[test]
    fn truncating_first_matches_clamping_first(cfg in proportional_config(), raw in wide()) {
        // A disabled config hands out zero before truncating anything.
        if !cfg.is_disabled() {
            prop_assert_eq!(cfg.finish(raw), ref_finish(&cfg, raw));
        }
    }

    #[test]
    fn next_delay_matches_the_u128_formula_from_any_state(
        cfg in proportional_config(),
        (attempt, base, spent) in (
            prop_oneof![Just(0), Just(1), Just(u32::MAX - 1), Just(u32::MAX), any::<u32>()],
            wide(),
            wide(),
        ),
        seed in any::<u64>(),
    ) {
        // Any state, even a base no sequence of this config reaches (from another
        // config, or past `max`): both paths of `next_delay` must agree with it.
        let mut got = Backoff { attempt, base, prev: base, spent, ..Backoff::new() };
        let mut want = got.clone();
        let (mut got_rng, mut want_rng) = (SplitMix64::new(seed), SplitMix64::new(seed));
        for _ in 0..12 {
            let d = got.next_delay(&cfg, &mut got_rng).map(duration_to_nanos);
            prop_assert_eq!(d, ref_next(&cfg, &mut want, &mut want_rng));
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(&got_rng, &want_rng, "same RNG consumption");
        }
    }
}

#[test]
fn fast_and_general_paths_agree_at_the_extremes() {
    let ns = Duration::from_nanos;
    let cfgs = [
        BackoffConfig::fluss_disk_write_locked(),
        BackoffConfig::grpc_connection(),
        builder_ns(3, 1 << 40)
            .multiplier(3, 2)
            .resolution(ns(7))
            .jitter(TWENTY_PERCENT)
            .build()
            .unwrap(),
        builder_ns(1, u64::MAX)
            .multiplier(u32::MAX, 1)
            .jitter(Jitter::Proportional { ppm: 1_000_000 })
            .build()
            .unwrap(),
        builder_ns(999_999, u64::MAX)
            .multiplier(16, 10)
            .resolution(ns(999_999))
            .floor(ns(3 * 999_999))
            .jitter(TWENTY_PERCENT)
            .total_budget(Some(ns(40_000_000)))
            .build()
            .unwrap(),
        builder_ns(1 << 45, u64::MAX)
            .resolution(ns(1 << 45))
            .jitter(TWENTY_PERCENT)
            .total_budget(Some(Duration::MAX))
            .build()
            .unwrap(),
    ];
    let states = [
        Backoff::new(),
        Backoff {
            attempt: u32::MAX,
            base: u64::MAX,
            ..Backoff::new()
        },
        Backoff {
            attempt: 3,
            base: u64::MAX / 3,
            spent: u64::MAX - 5,
            ..Backoff::new()
        },
    ];
    for cfg in &cfgs {
        for start in &states {
            let mut rng = SplitMix64::new(0x5eed);
            let (mut fast, mut general) = (start.clone(), start.clone());
            let mut general_rng = rng.clone();
            for _ in 0..40 {
                let want = general.next_delay_general(cfg, &mut general_rng);
                assert_eq!(
                    fast.next_delay(cfg, &mut rng),
                    want,
                    "{cfg:?} from {start:?}"
                );
                assert_eq!((&fast, &rng), (&general, &general_rng));
            }
        }
    }
}
