//! Scenario 4 (lockstep retries), CI-sized. Upstream (Gobblin): a fixed 500 ms initial delay
//! makes every client that lost the throttling server retry at the same instants.

use throttle_tests::sim::lockstep::{LockstepParams, compare};

#[test]
fn proportional_jitter_peak_is_at_most_a_tenth_of_the_lockstep_peak() {
    let p = LockstepParams::full(0.1);
    let r = compare(&p, 1);
    let peak = |name: &str| {
        r.results
            .iter()
            .find(|(n, _)| n.starts_with(name))
            .map(|(_, r)| r.clone())
            .unwrap()
    };
    let none = peak("no jitter");
    let prop = peak("proportional");
    assert_eq!(
        none.peak_per_bin,
        u64::from(p.clients),
        "all retry in one bin"
    );
    assert!(prop.peak_per_bin * 10 <= none.peak_per_bin, "{prop:?}");
    // Every jittered strategy gets everyone through long before the lockstep fleet does.
    let lockstep_done = none.all_succeeded_at.expect("within the horizon");
    for (name, res) in &r.results[1..] {
        let done = res.all_succeeded_at.expect(name);
        assert!(done < lockstep_done, "{name}");
        assert!(res.calls < none.calls, "{name}");
    }
}

#[test]
fn svg_plots_one_panel_per_strategy() {
    let r = compare(&LockstepParams::full(0.02), 1);
    let svg = r.svg(std::time::Duration::from_secs(40));
    assert_eq!(svg.matches("<path").count(), 6);
    assert!(
        svg.contains("no jitter (naive) (peak 200 per 10 ms)"),
        "{}",
        &svg[..600]
    );
}
