//! Scenario 5 (coordinator failover during admin writes), CI-sized. Upstream (Fluss): the
//! admin write gateway kept sending to the old coordinator (no refresh, connection cached by
//! uid); the fix refreshes on any recoverable error but auto-retries only "not the leader".

use throttle_tests::sim::failover::{FailoverParams, compare};

#[test]
fn ours_recovers_from_every_failover_and_never_executes_a_write_twice() {
    let r = compare(&FailoverParams::full(1.0), 1);
    let naive = r.get("naive").unwrap();
    let retry_all = r.get("retry-all").unwrap();
    let ours = r.get("ours").unwrap();
    assert_eq!(ours.executed_twice, 0);
    assert!(ours.recovery.iter().all(Option::is_some), "{ours:?}");
    assert!(
        naive.recovery.iter().all(Option::is_none),
        "naive never recovers"
    );
    assert!(ours.completed > 10 * naive.completed, "{r:?}");
    // Retrying writes whose outcome was unknown does execute some twice.
    assert!(retry_all.executed_twice > 0, "{retry_all:?}");
    // One refresh serves many callers: fewer refreshes than failed calls.
    assert!(ours.refreshes < ours.surfaced, "{ours:?}");
}
