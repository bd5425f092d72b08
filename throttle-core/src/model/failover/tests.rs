use super::*;

#[test]
fn empty_and_short_inputs_pass() {
    assert_eq!(check(&[]), Ok(()));
    assert_eq!(check(&[0xFF; 64]), Ok(()));
    assert_eq!(check(&[0x00; 64]), Ok(()));
}

/// A call under a fixed 100 ms backoff with a hard total reaches `BackoffExhausted`;
/// with the budget asked before the backoff, the budget logs a withdrawal the
/// specification does not ask for (found by proptest with the two checks swapped).
#[test]
fn backoff_refusal_is_reached_and_withdraws_nothing() {
    let data = [
        2, 11, 57, 1, 52, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 194, 8, 2, 2, 143, 0, 1,
    ];
    assert_eq!(check_call(&data), Ok(()));
}
