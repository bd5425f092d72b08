//! What a wall clock's step does to a gate, as `Instant`'s docs ("Wall-clock time freezes
//! gates") and `docs/design.md` §2.2 state it: the machines keep the latest instant they have
//! seen, so a step backwards freezes them for the size of the step and a step forwards expires
//! every deadline at once. These tests feed the gate wall-clock-like epoch milliseconds on
//! purpose, to show why a client must not.

use std::hash::RandomState;
use std::time::Duration;

use throttle_sansio::rng::FnRng;
use throttle_sansio::{GateState, Instant, Reason, WriteGate};

type Gate = WriteGate<u32, RandomState>;

/// 2025-12-01 in Unix milliseconds: what `Instant::from_millis(epoch_millis)` would hand in.
const WALL: u64 = 1_764_547_200_000;
const HOUR: Duration = Duration::from_secs(3_600);
const SECOND: Duration = Duration::from_secs(1);

/// A gate whose bucket 1 was rejected `DISK_WRITE_LOCKED` at `t0`: closed for exactly 1 s (the
/// word `2⁶³ + 1` draws the ±20 % factor 1.0).
fn gate_closed_at(t0: Instant) -> Gate {
    let mut gate = Gate::new(Default::default()).unwrap();
    let wait = gate.handle_disk_write_locked(t0, &1, 0, &mut FnRng(|| (1 << 63) + 1));
    assert_eq!(wait, SECOND);
    gate
}

#[test]
fn a_step_backwards_keeps_every_deadline_relative_to_the_latest_instant_seen() {
    let t0 = Instant::from_millis(WALL);
    let mut gate = gate_closed_at(t0);
    let closed = GateState::Closed {
        until: t0 + SECOND,
        reason: Reason::DISK_WRITE_LOCKED,
    };

    // NTP steps the wall clock back one hour, 100 ms after the rejection.
    let stepped = t0 + Duration::from_millis(100) - HOUR;
    // The gate clamps `stepped` to `t0`: for it no time passes, whatever the clock says.
    assert_eq!(gate.remaining(stepped, &1), SECOND);
    assert_eq!(gate.check(stepped, &1), closed);
    assert_eq!(gate.reopens_at(stepped, &1), Some(t0 + SECOND));
    // A caller sleeping until the reopening on its stepped-back clock sleeps 1 h 900 ms.
    assert_eq!(t0 + SECOND - stepped, HOUR + Duration::from_millis(900));

    // 59 minutes of real time later the bucket is still closed for the same second: frozen.
    let later = stepped + Duration::from_secs(59 * 60);
    gate.handle_send(later, &2); // other inputs do not thaw it
    gate.handle_timeout(later);
    assert_eq!(gate.remaining(later, &1), SECOND);
    assert_eq!(gate.check(later, &1), closed);

    // A new rejection while frozen counts from the latest instant seen, not from `later`.
    let wait = gate.handle_retriable_write(later, &3, 0, &mut FnRng(|| (1 << 63) + 1));
    assert_eq!(wait, Duration::from_millis(100));
    assert_eq!(
        gate.reopens_at(later, &3),
        Some(t0 + Duration::from_millis(100))
    );

    // Only when the wall clock passes the old deadline again does the bucket open.
    assert_eq!(
        gate.remaining(t0 + SECOND - Duration::from_nanos(1), &1),
        Duration::from_nanos(1)
    );
    assert_eq!(gate.check(t0 + SECOND, &1), GateState::Open);
}

#[test]
fn a_step_forwards_expires_every_deadline_at_once_and_its_correction_freezes() {
    let t0 = Instant::from_millis(WALL);
    let mut gate = gate_closed_at(t0);
    gate.handle_retriable_write(t0, &2, 0, &mut FnRng(|| (1 << 63) + 1));
    assert_eq!(gate.gated_len(), 2);

    // The wall clock jumps one hour ahead, 10 ms after the rejections.
    let jumped = t0 + Duration::from_millis(10) + HOUR;
    assert_eq!(
        gate.check(jumped, &1),
        GateState::Open,
        "1 s backoff over after 10 ms"
    );
    assert_eq!(gate.check(jumped, &2), GateState::Open);
    gate.handle_timeout(jumped);
    assert_eq!(gate.gated_len(), 0, "every deadline expired at once");

    // The clock is corrected back; the next rejection counts from the future instant seen.
    let corrected = t0 + Duration::from_millis(20);
    gate.handle_disk_write_locked(corrected, &1, 0, &mut FnRng(|| (1 << 63) + 1));
    assert_eq!(gate.reopens_at(corrected, &1), Some(jumped + SECOND));
    // Real time 59 minutes on: still closed for the full second, frozen behind the jump.
    let later = corrected + Duration::from_secs(59 * 60);
    assert_eq!(gate.remaining(later, &1), SECOND);
}
