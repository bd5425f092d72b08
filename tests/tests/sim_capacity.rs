//! Scenario 6 (capacity change, issue 18 item 4), CI-sized: phases of 2 s, 0.5 s left out of
//! each. The targets as `docs/simulation.md` ("6. Capacity change") states them from the data.

use throttle_tests::sim::capacity::{CapacityParams, Sizing, compare};

#[test]
fn adaptive_windows_keep_the_best_fixed_windows_throughput_through_a_capacity_drop() {
    let r = compare(&CapacityParams::ci(), 1);
    assert_eq!(r.best.sizing, Sizing::Fixed(40), "{}", r.candidates_table());
    for i in 0..3 {
        let best = r.best.phases[i];
        for adaptive in [&r.aimd, &r.gradient2] {
            let f = adaptive.phases[i];
            assert!(
                f.throughput >= 0.95 * best.throughput,
                "phase {i}: {:?} {f:?} against {best:?}\n{}",
                adaptive.sizing,
                r.table()
            );
        }
        // AIMD's p99: within 1.25× (measured 1.00, 1.21, 1.00 here; the 1.2× is
        // where a loss-based limiter that must provoke drops lands, see the docs).
        let f = r.aimd.phases[i];
        assert!(
            f.p99.as_secs_f64() <= 1.25 * best.p99.as_secs_f64(),
            "phase {i}: AIMD {f:?} against {best:?}\n{}",
            r.table()
        );
    }
    // At full capacity Gradient2's p99 is the best fixed window's too.
    for i in [0, 2] {
        let (f, best) = (r.gradient2.phases[i], r.best.phases[i]);
        assert!(
            f.p99.as_secs_f64() <= 1.2 * best.p99.as_secs_f64(),
            "{}",
            r.table()
        );
    }
    // The scenario separates the windows: Oxia's 4 serves an eighth of the full capacity.
    assert!(r.four.phases[0].throughput <= 0.2 * r.best.phases[0].throughput);
    // The adaptive windows follow the capacity: the limit at the end of the quarter phase is
    // below the one at the end of the first.
    let at = |v: &[u64], t: usize| v.get(t).copied().unwrap_or(0);
    let (end1, end2) = (19, 39);
    assert!(
        at(&r.aimd.limit, end2) < at(&r.aimd.limit, end1),
        "{:?}",
        r.aimd.limit
    );
}

#[test]
fn same_seed_same_figures() {
    let p = CapacityParams {
        phase: std::time::Duration::from_millis(500),
        settle: std::time::Duration::from_millis(100),
        candidates: vec![4, 40],
        ..CapacityParams::ci()
    };
    let (a, b) = (compare(&p, 7), compare(&p, 7));
    assert_eq!(a.table().to_string(), b.table().to_string());
    assert_eq!(a.aimd.limit, b.aimd.limit);
}
