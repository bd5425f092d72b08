//! Unit tests of the pending-bytes limiter.

use super::*;
use alloc::vec::Vec;

fn limiter(limit: u64) -> PendingBytesLimiter {
    PendingBytesLimiter::new(PendingBytesConfig::default().with_max_pending_bytes(limit))
}

fn granted(e: Result<Enqueued, Exhausted>) -> Grant {
    match e {
        Ok(Enqueued::Granted(g)) => g,
        other => panic!("expected an immediate grant, got {other:?}"),
    }
}

fn waiting(e: Result<Enqueued, Exhausted>) -> Ticket {
    match e {
        Ok(Enqueued::Waiting(t)) => t,
        other => panic!("expected to wait, got {other:?}"),
    }
}

fn drain(l: &mut PendingBytesLimiter) -> Vec<Grant> {
    let mut out = Vec::new();
    while let Some(PendingBytesAction::Proceed(g)) = l.poll_action() {
        out.push(g);
    }
    out
}

fn assert_conserved(l: &PendingBytesLimiter) {
    assert!(l.used() <= l.limit());
    assert_eq!(l.used() + l.available(), l.limit());
}

#[test]
fn default_bound_is_oxias_256_mib_and_validates() {
    let cfg = PendingBytesConfig::default();
    assert_eq!(cfg.max_pending_bytes(), 256 << 20);
    assert_eq!(cfg.validate(), Ok(()));
    assert_eq!(PendingBytesConfig::disabled().max_pending_bytes(), 0);
}

#[test]
fn operations_that_fit_are_granted_at_once() {
    let mut l = limiter(100);
    let a = granted(l.enqueue(60));
    let b = granted(l.enqueue(40));
    assert_eq!((a.charged(), b.charged()), (60, 40));
    assert_eq!((l.used(), l.available(), l.granted()), (100, 0, 2));
    assert_eq!(
        l.poll_action(),
        None,
        "immediate grants are answered, not queued"
    );
    assert!(a.ticket().id() < b.ticket().id());
}

#[test]
fn oversized_operation_is_clamped_to_the_limit_and_proceeds_alone() {
    let mut l = limiter(100);
    let small = granted(l.enqueue(1));
    let big = waiting(l.enqueue(1_000));
    assert_eq!(l.charge_for(1_000), 100);
    // It needs the whole limit, so it waits for the 1 byte held by `small`.
    l.release(small).unwrap();
    let g = drain(&mut l);
    assert_eq!(g.len(), 1);
    assert_eq!((g[0].ticket(), g[0].charged()), (big, 100));
    assert_eq!((l.used(), l.available()), (100, 0));
    // Alone: even one byte waits until it is released.
    let next = waiting(l.enqueue(1));
    l.release(g[0]).unwrap();
    assert_eq!(drain(&mut l)[0].ticket(), next);
    assert_conserved(&l);
}

#[test]
fn oversized_operation_on_an_idle_limiter_is_granted_at_once() {
    let mut l = limiter(100);
    let g = granted(l.enqueue(u64::MAX));
    assert_eq!(g.charged(), 100);
    assert_eq!(l.available(), 0);
    assert_eq!(l.try_acquire(1), None);
}

#[test]
fn zero_limit_grants_everything_at_once_and_counts_nothing() {
    let mut l = limiter(0);
    assert!(l.is_disabled());
    let grants: Vec<Grant> = [0, 1, 1 << 40, u64::MAX]
        .into_iter()
        .map(|n| granted(l.enqueue(n)))
        .collect();
    assert!(grants.iter().all(|g| g.charged() == 0));
    assert!(l.try_acquire(u64::MAX).is_some());
    assert_eq!((l.used(), l.available(), l.waiting()), (0, 0, 0));
    for g in &grants {
        l.release(*g).unwrap();
    }
    assert_eq!(drain(&mut l), Vec::new());
}

#[test]
fn zero_limit_still_refuses_double_and_bogus_release() {
    let mut l = limiter(0);
    let g = granted(l.enqueue(5));
    let other = granted(l.enqueue(5));
    assert_eq!(l.release(g), Ok(()));
    assert_eq!(l.release(g), Err(ReleaseError::AlreadyReleased));
    let bogus = Grant::forged(Ticket::forged(l.instance_tag(), u64::MAX, 0), 0);
    assert_eq!(l.release(bogus), Err(ReleaseError::Unknown));
    assert_eq!(l.state(other.ticket()), TicketState::Granted);
    assert_eq!(l.granted(), 1);
}

#[test]
fn small_request_waits_behind_a_big_waiting_one() {
    let mut l = limiter(100);
    let first = granted(l.enqueue(50));
    let big = waiting(l.enqueue(80));
    // 10 bytes would fit beside `first`, but FIFO keeps it behind `big`.
    let small = waiting(l.enqueue(10));
    assert_eq!((l.used(), l.waiting()), (50, 2));
    l.release(first).unwrap();
    let g = drain(&mut l);
    let order: Vec<Ticket> = g.iter().map(|g| g.ticket()).collect();
    assert_eq!(order, [big, small], "admitted in ticket order");
    assert_eq!(l.used(), 90);
    assert_conserved(&l);
}

#[test]
fn a_release_admits_only_the_prefix_that_fits() {
    let mut l = limiter(10);
    let hold = granted(l.enqueue(10));
    let a = waiting(l.enqueue(4));
    let b = waiting(l.enqueue(4));
    let c = waiting(l.enqueue(4));
    let d = waiting(l.enqueue(1));
    l.release(hold).unwrap();
    let order: Vec<Ticket> = drain(&mut l).iter().map(|g| g.ticket()).collect();
    assert_eq!(order, [a, b], "c does not fit, and d may not pass it");
    assert_eq!(l.state(c), TicketState::Waiting);
    assert_eq!(l.state(d), TicketState::Waiting);
    assert_eq!(l.used(), 8);
}

#[test]
fn try_acquire_fails_while_any_ticket_waits() {
    let mut l = limiter(100);
    let g = granted(l.enqueue(90));
    let w = waiting(l.enqueue(20));
    assert_eq!(l.available(), 10);
    assert_eq!(l.try_acquire(1), None, "would fit, but must not barge");
    assert_eq!(l.try_acquire(0), None, "not even zero bytes barge");
    assert_eq!(
        waiting(l.enqueue(0)).id(),
        w.id() + 1,
        "a refusal issues no id"
    );
    l.release(g).unwrap();
    assert_eq!(drain(&mut l).len(), 2);
    assert!(l.try_acquire(80).is_some());
    assert_eq!(l.try_acquire(1), None, "refused when it does not fit");
    assert_eq!(l.used(), 100);
}

#[test]
fn cancelling_the_waiting_head_admits_those_behind_it() {
    let mut l = limiter(100);
    let _hold = granted(l.enqueue(50));
    let head = waiting(l.enqueue(60));
    let next = waiting(l.enqueue(30));
    assert_eq!(l.cancel(head), Ok(Cancelled::Withdrawn));
    let g = drain(&mut l);
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].ticket(), next);
    assert_eq!((l.used(), l.waiting()), (80, 0));
    assert_eq!(l.state(head), TicketState::Done);
}

#[test]
fn cancelling_a_middle_waiter_admits_nobody_and_keeps_order() {
    let mut l = limiter(100);
    let hold = granted(l.enqueue(100));
    let a = waiting(l.enqueue(30));
    let b = waiting(l.enqueue(30));
    let c = waiting(l.enqueue(30));
    assert_eq!(l.cancel(b), Ok(Cancelled::Withdrawn));
    assert_eq!(l.poll_action(), None);
    assert_eq!((l.used(), l.waiting()), (100, 2));
    l.release(hold).unwrap();
    let order: Vec<Ticket> = drain(&mut l).iter().map(|g| g.ticket()).collect();
    assert_eq!(order, [a, c]);
    assert_eq!(l.used(), 60);
}

#[test]
fn cancelling_many_middle_waiters_keeps_fifo_conservation_and_bounded_memory() {
    let mut l = limiter(10);
    let hold = granted(l.enqueue(10));
    let line: Vec<Ticket> = (0..200).map(|_| waiting(l.enqueue(1))).collect();
    // Cancel a middle stretch, sparing every seventh ticket, with the head still blocked.
    let mut kept = Vec::new();
    let mut live = line.len();
    for (i, t) in line.iter().enumerate() {
        if (20..180).contains(&i) && i % 7 != 0 {
            assert_eq!(l.cancel(*t), Ok(Cancelled::Withdrawn));
            live -= 1;
            assert_eq!(l.poll_action(), None, "a middle cancel admits nobody");
            assert_eq!(l.waiting(), live, "waiting() counts live tickets exactly");
            assert!(l.queue.len() <= 2 * l.waiting() + 1, "tombstones bounded");
            assert_eq!(l.state(*t), TicketState::Done);
            assert_eq!(l.cancel(*t), Err(ReleaseError::AlreadyReleased));
        } else {
            kept.push(*t);
        }
    }
    assert_eq!((l.used(), l.granted()), (10, 1));
    // Admission walks past the tombstones in ticket order, as bytes come back.
    let mut held: VecDeque<Grant> = VecDeque::from([hold]);
    let mut admitted = Vec::new();
    while let Some(g) = held.pop_front() {
        l.release(g).unwrap();
        for g in drain(&mut l) {
            admitted.push(g.ticket());
            held.push_back(g);
        }
        assert_conserved(&l);
        assert_eq!(held.iter().map(|g| g.charged()).sum::<u64>(), l.used());
        assert!(
            l.used() == 10 || l.waiting() == 0,
            "the line is never left blocked"
        );
    }
    assert_eq!(
        admitted, kept,
        "exactly the surviving tickets, in ticket order"
    );
    assert_eq!((l.used(), l.waiting(), l.granted()), (0, 0, 0));
    assert!(l.queue.is_empty(), "no tombstone outlives the line");
}

#[test]
fn cancelling_the_head_admits_past_tombstones_behind_it() {
    let mut l = limiter(10);
    let hold = granted(l.enqueue(5));
    let head = waiting(l.enqueue(10));
    let gone: Vec<Ticket> = (0..3).map(|_| waiting(l.enqueue(1))).collect();
    let next = waiting(l.enqueue(4));
    let last = waiting(l.enqueue(2));
    for t in &gone {
        assert_eq!(l.cancel(*t), Ok(Cancelled::Withdrawn));
    }
    assert_eq!(l.cancel(head), Ok(Cancelled::Withdrawn));
    let order: Vec<Ticket> = drain(&mut l).iter().map(|g| g.ticket()).collect();
    assert_eq!(order, [next], "4 B fits beside 5 B; 2 B more does not");
    assert_eq!((l.used(), l.waiting()), (9, 1));
    assert_eq!(l.state(last), TicketState::Waiting);
    assert_eq!(l.try_acquire(0), None, "a live waiter still blocks barging");
    l.release(hold).unwrap();
    assert_eq!(drain(&mut l)[0].ticket(), last);
}

#[test]
fn cancelling_a_granted_ticket_releases_its_bytes_once() {
    let mut l = limiter(100);
    let g = granted(l.enqueue(70));
    let w = waiting(l.enqueue(70));
    assert_eq!(l.cancel(g.ticket()), Ok(Cancelled::Released));
    assert_eq!(drain(&mut l)[0].ticket(), w);
    assert_eq!(l.used(), 70);
    // The bytes came back once: neither path may return them again.
    assert_eq!(l.release(g), Err(ReleaseError::AlreadyReleased));
    assert_eq!(l.cancel(g.ticket()), Err(ReleaseError::AlreadyReleased));
    assert_eq!(l.used(), 70);
    assert_conserved(&l);
}

#[test]
fn cancelling_an_admitted_ticket_before_its_proceed_is_drained_drops_the_proceed() {
    let mut l = limiter(10);
    let hold = granted(l.enqueue(10));
    let a = waiting(l.enqueue(10));
    let b = waiting(l.enqueue(10));
    l.release(hold).unwrap();
    // `a` was admitted, but its waiter gave up before hearing about it.
    assert_eq!(l.cancel(a), Ok(Cancelled::Released));
    let g = drain(&mut l);
    assert_eq!(g.len(), 1, "no Proceed for the cancelled ticket");
    assert_eq!(g[0].ticket(), b);
    assert_eq!((l.used(), l.granted()), (10, 1));
}

#[test]
fn double_release_is_refused_and_changes_nothing() {
    let mut l = limiter(100);
    let a = granted(l.enqueue(40));
    let b = granted(l.enqueue(40));
    l.release(a).unwrap();
    let before = (l.used(), l.available(), l.granted());
    assert_eq!(l.release(a), Err(ReleaseError::AlreadyReleased));
    assert_eq!((l.used(), l.available(), l.granted()), before);
    assert_eq!(l.state(b.ticket()), TicketState::Granted);
}

#[test]
fn bogus_tickets_are_unknown_and_change_nothing() {
    let mut l = limiter(100);
    let g = granted(l.enqueue(40));
    let w = waiting(l.enqueue(100));
    let never = Ticket::forged(l.instance_tag(), 1 << 62, 0);
    let far_slot = Ticket::forged(l.instance_tag(), 1 << 62, u32::MAX);
    assert_eq!(l.cancel(never), Err(ReleaseError::Unknown));
    assert_eq!(l.cancel(far_slot), Err(ReleaseError::Unknown));
    assert_eq!(
        l.release(Grant::forged(never, 40)),
        Err(ReleaseError::Unknown)
    );
    // A grant naming a ticket that is still waiting was not issued by this limiter.
    assert_eq!(l.release(Grant::forged(w, 100)), Err(ReleaseError::Unknown));
    assert_eq!(l.state(never), TicketState::Unknown);
    assert_eq!((l.used(), l.waiting(), l.granted()), (40, 1, 1));
    assert_eq!(l.state(g.ticket()), TicketState::Granted);
    assert_eq!(l.state(w), TicketState::Waiting);
}

#[test]
fn withdrawn_ticket_cannot_be_cancelled_again() {
    let mut l = limiter(10);
    let _hold = granted(l.enqueue(10));
    let w = waiting(l.enqueue(5));
    assert_eq!(l.cancel(w), Ok(Cancelled::Withdrawn));
    assert_eq!(l.cancel(w), Err(ReleaseError::AlreadyReleased));
    assert_eq!(l.waiting(), 0);
}

#[test]
fn ticket_ids_are_never_reused_even_after_the_limiter_goes_idle() {
    let mut l = limiter(10);
    let first = granted(l.enqueue(5));
    l.release(first).unwrap();
    // Idle: internal entries are recycled, but the old ticket stays finished.
    let second = granted(l.enqueue(5));
    assert!(second.ticket().id() > first.ticket().id());
    assert_eq!(l.state(first.ticket()), TicketState::Done);
    assert_eq!(l.release(first), Err(ReleaseError::AlreadyReleased));
    assert_eq!(l.state(second.ticket()), TicketState::Granted);
    assert_eq!(l.used(), 5);
}

#[test]
fn extreme_sizes_and_limits_never_overflow() {
    let mut l = limiter(u64::MAX);
    let a = granted(l.enqueue(u64::MAX - 1));
    let b = granted(l.enqueue(1));
    assert_eq!((l.used(), l.available()), (u64::MAX, 0));
    let c = waiting(l.enqueue(u64::MAX));
    assert_eq!(l.try_acquire(u64::MAX), None);
    l.release(a).unwrap();
    assert_eq!(
        l.poll_action(),
        None,
        "the whole limit is needed, 1 byte is held"
    );
    l.release(b).unwrap();
    let g = drain(&mut l);
    assert_eq!((g[0].ticket(), g[0].charged()), (c, u64::MAX));
    assert_conserved(&l);
    l.release(g[0]).unwrap();
    assert_eq!((l.used(), l.available()), (0, u64::MAX));
}

#[test]
fn zero_byte_ticket_at_the_head_is_admitted_beside_a_full_limit() {
    let mut l = limiter(10);
    let hold = granted(l.enqueue(10));
    let z = granted(l.enqueue(0));
    assert_eq!(z.charged(), 0);
    let big = waiting(l.enqueue(10));
    let z2 = waiting(l.enqueue(0));
    l.release(hold).unwrap();
    let order: Vec<Ticket> = drain(&mut l).iter().map(|g| g.ticket()).collect();
    assert_eq!(order, [big, z2]);
}

#[test]
fn undrained_actions_stay_bounded_when_grants_are_released_unannounced() {
    let mut l = limiter(1);
    let mut hold = granted(l.enqueue(1));
    for _ in 0..1_000 {
        let next = waiting(l.enqueue(1));
        l.release(hold).unwrap();
        // Released without ever draining its Proceed.
        hold = Grant::forged(next, 1);
        assert_eq!(l.state(next), TicketState::Granted);
    }
    assert!(
        l.actions.len() <= 2 * l.granted() + 17,
        "{}",
        l.actions.len()
    );
    let g = drain(&mut l);
    assert_eq!(g.len(), 1, "only the live grant is announced");
    assert_eq!(g[0].ticket(), hold.ticket());
}

#[test]
#[cfg_attr(miri, ignore)]
fn conservation_holds_through_a_random_mix_of_calls() {
    use crate::rng::{SplitMix64, below};
    let mut rng = SplitMix64::new(7);
    let mut l = limiter(64);
    let mut tickets: Vec<Ticket> = Vec::new();
    let mut grants: Vec<Grant> = Vec::new();
    for _ in 0..2_000 {
        match below(&mut rng, 4) {
            0 => match l.enqueue(below(&mut rng, 80)) {
                Ok(Enqueued::Granted(g)) => grants.push(g),
                Ok(Enqueued::Waiting(t)) => tickets.push(t),
                Err(e) => panic!("ids spent: {e}"),
            },
            1 if !grants.is_empty() => {
                let i = below(&mut rng, grants.len() as u64) as usize;
                let _ = l.release(grants[i]);
            }
            2 if !tickets.is_empty() => {
                let i = below(&mut rng, tickets.len() as u64) as usize;
                let _ = l.cancel(tickets[i]);
            }
            _ => {
                if let Some(g) = l.try_acquire(below(&mut rng, 80)) {
                    grants.push(g);
                }
            }
        }
        grants.extend(drain(&mut l));
        assert_conserved(&l);
        let live: u64 = grants
            .iter()
            .filter(|g| l.state(g.ticket()) == TicketState::Granted)
            .map(|g| g.charged())
            .sum();
        assert_eq!(live, l.used());
    }
}

#[test]
fn another_limiters_ticket_and_grant_are_unknown_and_change_nothing() {
    let mut one = limiter(100);
    let mut two = limiter(100);
    assert_ne!(one.instance_tag(), two.instance_tag());
    let held = granted(one.enqueue(60));
    let queued = waiting(one.enqueue(60));
    // The second limiter issues the same ids in the same slots.
    let theirs = granted(two.enqueue(60));
    assert_eq!(
        (theirs.ticket().id(), theirs.ticket().slot()),
        (held.ticket().id(), held.ticket().slot())
    );
    let before = (one.used(), one.waiting(), one.granted());
    assert_eq!(one.release(theirs), Err(ReleaseError::Unknown));
    assert_eq!(one.cancel(theirs.ticket()), Err(ReleaseError::Unknown));
    assert_eq!(one.state(theirs.ticket()), TicketState::Unknown);
    assert_eq!((one.used(), one.waiting(), one.granted()), before);
    assert_eq!(one.state(queued), TicketState::Waiting);
    assert_eq!(two.used(), 60);
    assert_eq!(one.release(held), Ok(()));
}

#[test]
fn spent_ticket_ids_are_refused_and_issued_tickets_still_release() {
    let mut l = limiter(10);
    l.skip_ids_to(u64::MAX - 2);
    let a = granted(l.enqueue(10));
    let b = waiting(l.enqueue(5));
    assert_eq!(b.id(), u64::MAX - 1, "the last id");
    // Ids never wrap: the next request is refused and changes nothing.
    assert_eq!(l.enqueue(1), Err(Exhausted));
    assert_eq!(l.try_acquire(0), None);
    assert_eq!((l.used(), l.waiting(), l.granted()), (10, 1, 1));
    assert_eq!(l.release(a), Ok(()));
    let Some(PendingBytesAction::Proceed(g)) = l.poll_action() else {
        panic!("the waiting ticket is admitted");
    };
    assert_eq!(g.ticket(), b);
    assert_eq!(l.release(g), Ok(()));
    assert_eq!(l.used(), 0);
    assert_eq!(l.enqueue(1), Err(Exhausted), "still refused once idle");
}
